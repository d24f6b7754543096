"""torch's ``torch.distributed.algorithms`` path, plus gradient-communication algorithms.

* :mod:`.ddp_comm_hooks` -- DDP communication hooks (plain, fp16/bf16, PowerSGD, Top-K);
* :mod:`.hierarchical` -- ``hierarchical_all_reduce`` and ``host_groups`` (reduce in the host,
  all-reduce among host leaders, broadcast in the host);
* :mod:`.communication_optimizer` -- seed 003's ``CommunicationOptimizer`` facade over both.
"""
