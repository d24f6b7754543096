"""Solution to notebook 12's exercise: exposed communication from one step's spans.

Exposed = the length of the union of the communication intervals minus what compute covers;
waiting is not compute (``"wait"`` spans, and the tail of backward that only waits for DDP's
buckets: from the latest bucket start to the latest bucket end).

>>> exposed_comm([("backward", "backward", 0, 4), ("all_reduce", "collective", 3, 6)])
2.0
"""

COMPUTE = {"forward", "backward", "optimizer", "compute"}


def _union(intervals):
    out = []
    for a, b in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _minus(base, cut):
    pieces = [tuple(iv) for iv in base]
    for c, d in cut:
        pieces = [p for x, y in pieces for p in ((x, min(y, c)), (max(x, d), y)) if p[1] > p[0]]
    return pieces


def exposed_comm(spans):
    comm = [(s, e) for _, cat, s, e in spans if cat == "collective"]
    compute = [(s, e) for _, cat, s, e in spans if cat in COMPUTE]
    waits = [(s, e) for _, cat, s, e in spans if cat == "wait"]
    buckets = [(s, e) for _, cat, s, e in spans if cat == "bucket"]
    if buckets:
        waits.append((max(s for s, _ in buckets), max(e for _, e in buckets)))
    busy = _minus(_union(compute), _union(waits))
    return float(sum(b - a for a, b in _minus(_union(comm), _union(busy))))
