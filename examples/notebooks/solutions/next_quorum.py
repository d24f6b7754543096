"""Solution to notebook 09's exercise: the lighthouse's quorum rule.

Only healthy replicas' requests count; wait while there are fewer than the largest ``min_replicas``
asked for (the lighthouse's or any request's); while a healthy replica has not asked, wait up to
``join_timeout`` from the oldest request, then go on without it. The members are sorted (a member's
index is its rank); those behind the highest committed step heal from the up-to-date ones, round
robin; at step 0 with ``init_sync`` every member heals from the first, so all start from one state.

>>> from neural_arch.distributed.ft import QuorumRequest
>>> reqs = {m: QuorumRequest(m, n=1, step=s, since=0.0) for m, s in (("a", 4), ("b", 4), ("c", 0))}
>>> next_quorum(reqs, {"a", "b", "c"}, min_replicas=2, join_timeout=1.0, now=0.1)
(('a', 'b', 'c'), {'c': 'a'})
>>> next_quorum(reqs, {"a", "b", "c", "d"}, min_replicas=2, join_timeout=1.0, now=0.1) is None   # d may ask
True
"""


def next_quorum(requests, healthy, min_replicas, join_timeout, now):
    asked = {m: r for m, r in requests.items() if m in healthy}
    if not asked or len(asked) < max([min_replicas] + [r.min_replicas for r in asked.values()]):
        return None
    if set(healthy) - set(asked) and now - min(r.since for r in asked.values()) < join_timeout:
        return None
    members = tuple(sorted(asked))
    top = max(asked[m].step for m in members)
    if top == 0 and any(asked[m].init_sync for m in members):
        sources, behind = [members[0]], members[1:]
    else:
        sources = [m for m in members if asked[m].step == top]
        behind = [m for m in members if asked[m].step < top]
    return members, {m: sources[i % len(sources)] for i, m in enumerate(behind)}
