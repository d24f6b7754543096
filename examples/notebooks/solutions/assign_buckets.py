"""Solution to notebook 07's exercise: DDP's bucket assignment (one dtype).

Walk the parameters in reverse registration order (the order backward produces their gradients),
add each to the open bucket, and close the bucket once it holds at least its cap: ``first_cap``
for the first bucket (small, so communication starts early), ``cap`` for every later one.

>>> assign_buckets([8, 8, 8], cap=16, first_cap=8)
[[2], [1, 0]]
"""


def assign_buckets(param_nbytes, cap, first_cap):
    first_cap = min(first_cap, cap)            # a first bucket larger than the others makes no sense
    buckets, current, filled = [], [], 0
    for i in reversed(range(len(param_nbytes))):
        current.append(i)
        filled += param_nbytes[i]
        if filled >= (first_cap if not buckets else cap):
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets
