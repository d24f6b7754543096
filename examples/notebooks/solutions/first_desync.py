"""Solution to notebook 08's exercise: the first desync in the ranks' flight-recorder records.

Compare the collectives (point-to-point records have their own numbering: skip them) sequence number by
sequence number, from the first number every rank still holds (each ring forgets its oldest records) to
the last number any rank holds. At each number the expected op is the most common
``(op, shape, dtype, reduce_op, root)`` among the ranks that have a record there (a tie: the lowest
rank's); the first number at which some rank has another op, or none at all (it is behind), is the desync.

>>> def rec(seq, op="all_reduce", shape=(4,)):
...     return {"seq": seq, "op": op, "shape": list(shape), "dtype": "float32", "reduce_op": "sum",
...             "root": None, "p2p": False}
>>> first_desync({0: [rec(1), rec(2)], 1: [rec(1), rec(2, shape=(5,))], 2: [rec(1), rec(2)]})
(2, [1])
"""
from collections import Counter


def _key(e):
    shape = e.get("shape")
    return (e["op"], tuple(shape) if shape is not None else None, e.get("dtype"), e.get("reduce_op"), e.get("root"))


def first_desync(records):
    hist = {r: {e["seq"]: e for e in entries if not e.get("p2p")} for r, entries in sorted(records.items())}
    held = [h for h in hist.values() if h]
    if not held:
        return None
    low = max(min(h) for h in held)             # older numbers are gone from some ring: not comparable
    high = max(max(h) for h in held)
    for seq in range(low, high + 1):
        keys = {r: _key(h[seq]) for r, h in hist.items() if seq in h}
        counts = Counter(keys.values())
        top = max(counts.values())
        expected = next(k for r, k in keys.items() if counts[k] == top)   # ranks in order: a tie goes low
        odd = [r for r in hist if keys.get(r) != expected]               # another op, or none (behind)
        if odd:
            return seq, odd
    return None
