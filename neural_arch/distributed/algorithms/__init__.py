"""torch's ``torch.distributed.algorithms`` path, plus gradient-communication algorithms.

* :mod:`.ddp_comm_hooks` -- DDP communication hooks (plain, fp16/bf16, PowerSGD, Top-K);
* :mod:`.hierarchical` -- ``hierarchical_all_reduce`` and ``host_groups``: the leader form (reduce
  in the host, all-reduce among host leaders, broadcast in the host) and the 2-D form
  (reduce-scatter in the host, all-reduce of each slice across hosts, all-gather in the host);
* :mod:`.hierarchical_auto` -- when ``dist.all_reduce`` takes a hierarchical form by itself
  (groups spanning machines, ``NEURAL_ARCH_HIERARCHICAL``);
* :mod:`.communication_optimizer` -- seed 003's ``CommunicationOptimizer`` facade over both.
"""
