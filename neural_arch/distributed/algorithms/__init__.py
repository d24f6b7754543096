"""torch's ``torch.distributed.algorithms`` path: :mod:`.ddp_comm_hooks` (DDP communication hooks)."""
