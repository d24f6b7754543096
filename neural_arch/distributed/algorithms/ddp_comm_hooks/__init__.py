"""DDP communication hooks under torch's names (``torch.distributed.algorithms.ddp_comm_hooks``).

Register one with ``DistributedDataParallel.register_comm_hook(state, hook)``; the contract is in
:mod:`neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook`.

=====================================  ===================================================================
hook                                   what goes on the wire
=====================================  ===================================================================
``default_hooks.allreduce_hook``       the gradients (DDP's default: the average)
``default_hooks.fp16_compress_hook``   the gradients cast to float16, averaged, cast back
``default_hooks.bf16_compress_hook``   the same in bfloat16 (ml_dtypes on NumPy)
``powerSGD_hook.powerSGD_hook``        rank-r factors P, Q of each gradient matrix (error feedback)
``topk_hook.topk_hook``                the top ``ratio`` entries per rank, indices + values (error feedback)
=====================================  ===================================================================

Example::

    from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
"""

from neural_arch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook, topk_hook  # noqa: F401
