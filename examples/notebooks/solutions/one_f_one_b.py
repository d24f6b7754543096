"""Solution to notebook 03's exercise: the 1F1B compute order of every rank.

Rank r warms up with ``min(p - 1 - r, m)`` forwards, then alternates one forward and one backward
while forwards remain, then drains the remaining backwards.

>>> one_f_one_b(2, 3)
[['F0', 'F1', 'B0', 'F2', 'B1', 'B2'], ['F0', 'B0', 'F1', 'B1', 'F2', 'B2']]
"""


def one_f_one_b(p, m):
    orders = []
    for rank in range(p):
        warmup = min(p - 1 - rank, m)
        order = [f"F{i}" for i in range(warmup)]
        f, b = warmup, 0
        while f < m:                       # steady state: one forward, then one backward
            order.append(f"F{f}")
            f += 1
            order.append(f"B{b}")
            b += 1
        order += [f"B{i}" for i in range(b, m)]   # cool-down
        orders.append(order)
    return orders
