"""Solution to notebook 06's exercise: the optimizer-state bytes each rank holds under ZeRO-1.

ZeRO-1 gives every parameter one owner, which alone keeps its optimizer state. torch's
``ZeroRedundancyOptimizer`` assigns them greedily: the largest parameter first, each to the rank
with the fewest bytes so far (the lowest rank on a tie). A rank's state is its parameters' bytes
times the state arrays per parameter: SGD none, momentum one, Adam two.

>>> zero1_state_bytes([800, 80, 400, 400], world=2, optimizer="adam")   # 800 | 400 + 400, then 80 to rank 0
[1760, 1600]
"""

STATE_ARRAYS = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}


def zero1_state_bytes(param_nbytes, world, optimizer):
    load = [0] * world
    for i in sorted(range(len(param_nbytes)), key=lambda i: -param_nbytes[i]):   # stable: ties in order
        lightest = load.index(min(load))
        load[lightest] += param_nbytes[i]
    return [STATE_ARRAYS[optimizer] * b for b in load]
