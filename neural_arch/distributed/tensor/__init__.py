"""torch's ``torch.distributed.tensor`` home. ``experimental`` holds context parallelism
(:mod:`neural_arch.distributed.tensor.experimental`)."""
