"""The save plan: who writes which chunk, agreed by every rank, and cached while the layout holds.

Every rank describes its array leaves as (key, path, global shape, dtype, region); the plan is a
pure function of all ranks' descriptions (:func:`make_plan`), so every rank computes the same one:

* pieces held by one rank (tensor-parallel boxes, FSDP flat ranges) are written by that rank;
* a **replicated** piece (held whole by several ranks) is written once. One of at least
  ``SPLIT_MIN_BYTES`` is cut into row blocks, one per holder (at most one per row), so a big
  embedding is written by every rank in parallel rather than by one; then the replicated pieces
  go, largest first, to the holder with the fewest bytes so far (LPT scheduling), which balances
  the bytes each rank writes (and, for ``async_save``, copies while training waits).

The exchange (:class:`PlanCache`) costs one small all-gather per save once the layout is known:
each rank sends a 16-byte digest of its description plus its half of a fresh save id; when every
digest equals the one from the last full exchange the cached plan is reused (no pickling, no
planning). Otherwise the descriptions are exchanged with ``all_gather_object`` and planned anew.

Example (two ranks that both hold a replicated 2 MiB matrix; pure data, no processes)::

    >>> import numpy as np
    >>> mine = describe({"w": np.zeros((512, 512), np.float64)})[2]
    >>> entries, owners, objects = make_plan([mine, mine])
    >>> [(c["offsets"], c["sizes"], c["rank"]) for c in entries["w"]["chunks"]]
    [([0, 0], [256, 512], 0), ([256, 0], [256, 512], 1)]
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os

import numpy as np

from neural_arch.distributed.checkpoint.flatten import (
    encode_object,
    flatten_state_dict,
    is_array_leaf,
    to_host,
)
from neural_arch.distributed.checkpoint.sharded import Region, ShardedArray
from neural_arch.distributed.checkpoint.storage import CheckpointError

__all__ = ["SPLIT_MIN_BYTES", "PlanCache", "describe", "make_plan", "my_pieces"]

SPLIT_MIN_BYTES = 256 << 10  # a replicated piece this big is split over its holders (smaller: one writer)
_DIGEST = 16                 # bytes of blake2b per rank description
_UID = 6                     # random bytes each rank proposes for the save id (rank 0's is used)


def describe(state_dict):
    """(array items, object items, plan) of this rank's state dict.

    ``arrays``: {(key, region key): (host array, Region)}; ``plan``: {"arrays": [(key, path, global
    shape, dtype str, region json)], "objects": {key: (path, encoded value)}, "signature": the same
    layout as nested tuples (for ``_layout_digest``)}.

    Example:
        >>> arrays, objects, plan = describe({"w": np.zeros((2, 3)), "epoch": 1})
        >>> plan["arrays"]
        [('w', ['w'], [2, 3], '<f8', {'offsets': [0, 0], 'sizes': [2, 3]})]
        >>> objects
        {'epoch': (['epoch'], 1)}
    """
    arrays, objects, plan_arrays, signature = {}, {}, [], []
    for key, path, leaf in flatten_state_dict(state_dict):
        if is_array_leaf(leaf):
            if isinstance(leaf, ShardedArray):
                local = to_host(leaf.local)
                region = Region.of(leaf)
                rkey, rjson = region.key(), region.to_json()
            else:
                local = to_host(leaf)
                region, rkey = _whole(local.shape)
                rjson = {"offsets": [0] * len(region.sizes), "sizes": list(region.sizes)}  # fresh: callers may keep it
            arrays[(key, rkey)] = (local, region)
            plan_arrays.append((key, path, list(region.global_shape), local.dtype.str, rjson))
            # the same facts, immutable: what _layout_digest compares (nobody can change it later)
            signature.append((key, tuple(path), region.global_shape, local.dtype.str, rkey))
        else:
            objects[key] = (path, encode_object(leaf))
    signature = (tuple(signature), tuple(sorted(objects)))
    return arrays, objects, {"arrays": plan_arrays, "objects": objects, "signature": signature}


@functools.lru_cache(maxsize=4096)
def _whole(shape: tuple) -> tuple[Region, tuple]:
    # A whole array's region depends only on its shape (Region is frozen): async_save describes
    # the same leaves at every save, and rebuilding them was a visible part of its blocked time.
    shape = tuple(int(s) for s in shape)
    region = Region(shape, (0,) * len(shape), shape)
    return region, region.key()


_last_digest: tuple = (None, b"")  # (signature, digest) of the last layout hashed; replaced whole


def _layout_digest(plan: dict) -> bytes:
    """What the plan depends on: the array descriptions and which plain keys this rank has.

    ``describe``'s immutable ``signature`` of the same facts is compared with the last one
    first: equal tuples mean equal JSON, and comparing costs a fraction of encoding and hashing
    (async_save's caller waits for this at every save).
    """
    global _last_digest
    signature, last = plan.get("signature"), _last_digest  # one read: another thread may replace it
    if signature is not None and signature == last[0]:
        return last[1]
    text = json.dumps([plan["arrays"], sorted(plan["objects"])], separators=(",", ":"), default=str)
    digest = hashlib.blake2b(text.encode(), digest_size=_DIGEST).digest()
    if signature is not None:
        _last_digest = (signature, digest)
    return digest


def make_plan(plans: list[dict]):
    """Same on every rank: ``(entries, owners, objects)``.

    ``entries``: {key: {"path", "global_shape", "dtype", "chunks": [region json + name + writer rank]}};
    ``owners``: {(key, region key): [(writer rank, chunk name, rows or None)]}: ``rows = (a, b)``
    means the chunk is rows ``a:b`` (dim 0) of that piece; ``objects``: {key: {"path", "value"}}.
    Raises :class:`~neural_arch.distributed.checkpoint.storage.CheckpointError` when ranks disagree
    on a key's shape/dtype or the pieces of a key do not tile it exactly.

    Example:
        >>> plan = describe({"w": np.zeros((2, 3))})[2]
        >>> entries, owners, objects = make_plan([plan, plan])     # two ranks, both hold w whole
        >>> [c["rank"] for c in entries["w"]["chunks"]]            # small: written once
        [0]
    """
    entries: dict[str, dict] = {}
    holders: dict[tuple, list[int]] = {}
    regions: dict[tuple, Region] = {}
    for rank, plan in enumerate(plans):
        for key, path, gshape, dtype, rjson in plan["arrays"]:
            entry = entries.setdefault(key, {"path": path, "global_shape": gshape, "dtype": dtype, "chunks": []})
            if entry["global_shape"] != gshape or entry["dtype"] != dtype:
                raise CheckpointError(f"save: {key!r} is {tuple(entry['global_shape'])} {np.dtype(entry['dtype'])} "
                                      f"on one rank but {tuple(gshape)} {np.dtype(dtype)} on rank {rank}; every "
                                      "rank must describe the same global array")
            region = Region.from_json(gshape, rjson)
            rk = (key, region.key())
            if rk not in holders:
                holders[rk] = []
                regions[rk] = region
            holders[rk].append(rank)
    by_key: dict[str, list[tuple]] = {}
    for rk in holders:
        by_key.setdefault(rk[0], []).append(rk)
    pieces = []  # (rk, n, rows, nbytes, holders)
    for key in sorted(entries):
        entry = entries[key]
        mine = sorted(by_key[key], key=lambda rk: rk[1])
        kinds = {regions[rk].is_flat for rk in mine}
        if len(kinds) > 1:
            raise CheckpointError(f"save: {key!r} is saved as box pieces by some ranks and flat pieces by "
                                  "others; every rank must shard one key the same way")
        total = sum(regions[rk].numel for rk in mine)
        want = math.prod(entry["global_shape"])
        if total != want or overlapping([regions[rk] for rk in mine]):
            raise CheckpointError(f"save: the pieces of {key!r} cover {total} elements of {want} (or overlap): "
                                  f"shape {tuple(entry['global_shape'])}, pieces {[regions[rk].to_json() for rk in mine]}; "
                                  "the ranks' ShardedArrays must tile the global array exactly")
        itemsize = np.dtype(entry["dtype"]).itemsize
        n = 0
        for rk in mine:
            region, ranks = regions[rk], holders[rk]
            for rows in _row_blocks(region, len(ranks), itemsize):
                numel = region.numel if rows is None else (rows[1] - rows[0]) * math.prod(region.sizes[1:])
                pieces.append((rk, n, rows, numel * itemsize, ranks))
                n += 1
    load = {r: 0 for r in range(len(plans))}
    writer_of = {}
    for p in pieces:  # pieces only one rank holds: no choice
        if len(p[4]) == 1:
            writer_of[p[0], p[1]] = p[4][0]
            load[p[4][0]] += p[3]
    # LPT: replicated pieces largest first, each to the holder with the fewest bytes so far
    for rk, n, _, nbytes, ranks in sorted((p for p in pieces if len(p[4]) > 1), key=lambda p: (-p[3], p[0][0], p[1])):
        w = min(ranks, key=lambda r: (load[r], r))
        writer_of[rk, n] = w
        load[w] += nbytes
    owners: dict[tuple, list] = {}
    for rk, n, rows, _, _ in pieces:
        key, region = rk[0], regions[rk]
        name, writer = f"{key}#{n}", writer_of[rk, n]
        owners.setdefault(rk, []).append((writer, name, rows))
        rjson = region.to_json() if rows is None else {
            "offsets": [region.offsets[0] + rows[0], *region.offsets[1:]],
            "sizes": [rows[1] - rows[0], *region.sizes[1:]]}
        entries[key]["chunks"].append(dict(rjson, name=name, rank=writer))
    objects: dict[str, dict] = {}
    for plan in plans:  # plain values: the lowest rank that has one wins (they should agree)
        for key, (path, value) in plan["objects"].items():
            objects.setdefault(key, {"path": path, "value": value})
    return entries, owners, objects


def _row_blocks(region: Region, holders: int, itemsize: int) -> list:
    """[None] (one chunk), or row ranges [(a, b), ...] splitting a big replicated box over its holders."""
    if holders < 2 or region.is_flat or not region.sizes or region.sizes[0] < 2 \
            or region.numel * itemsize < SPLIT_MIN_BYTES:
        return [None]
    k = min(holders, region.sizes[0])
    bounds = [region.sizes[0] * i // k for i in range(k + 1)]
    return list(itertools.pairwise(bounds))


def overlapping(regions: list[Region]) -> bool:
    if regions and regions[0].is_flat:
        spans = sorted((r.flat_offset, r.flat_offset + r.flat_size) for r in regions if r.flat_size)
        return any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(spans))
    nonempty = [r for r in regions if r.numel]
    for i, a in enumerate(nonempty):
        for b in nonempty[i + 1:]:
            if all(max(x, y) < min(x + n, y + m) for x, n, y, m in zip(a.offsets, a.sizes, b.offsets, b.sizes)):
                return True
    return False


def my_pieces(arrays: dict, owners: dict, rank: int):
    """Yield ``(rk, chunk name, array)`` for every chunk ``rank`` writes (row blocks are views).

    Example:
        >>> arrays, _, plan = describe({"w": np.zeros((2, 3))})
        >>> owners = make_plan([plan, plan])[1]
        >>> [name for _, name, _ in my_pieces(arrays, owners, 0)], list(my_pieces(arrays, owners, 1))
        (['w#0'], [])
    """
    for rk, (local, _) in arrays.items():
        for writer, name, rows in owners[rk]:
            if writer == rank:
                yield rk, name, (local if rows is None else local[rows[0]:rows[1]])


class PlanCache:
    """The plan exchange of ``save``/``async_save``, remembering the last plan per process group.

    ``exchange(pg, rank, world, plan)`` returns ``(uid, entries, owners, objects, early)``;
    ``entries`` may be the cached object itself: callers copy before changing it (``_commit`` does).

    Example:
        >>> cache = PlanCache()
        >>> plan = describe({"w": np.zeros(3)})[2]
        >>> uid, entries, owners, objects, early = cache.exchange(None, 0, 1, plan)   # a world of one
        >>> _ = cache.exchange(None, 0, 1, plan); cache.hits                           # same layout: reused
        1
    """

    def __init__(self) -> None:
        self._last = None  # (group, digests, entries, owners, objects keys, rank 0 has every object key)
        self.hits = 0      # how many exchanges reused the cached plan (for tests and benchmarks)

    def exchange(self, pg, rank: int, world: int, plan: dict, while_waiting=None):
        """``(uid, entries, owners, objects, early)``: the plan, and what ``while_waiting`` returned.

        ``while_waiting(owners)``, when given, runs while the digests travel, with the cached plan's
        owners, if this rank's own layout matches the cached plan (``async_save`` copies its chunks
        to staging buffers then, so the collective's latency hides behind the copy). ``early`` is
        its result when the plan was indeed reused, else None (the caller redoes that work).
        """
        digest = _layout_digest(plan)
        uid_bytes = os.urandom(_UID)
        last = self._last
        speculate = while_waiting is not None and last is not None and last[0] is pg and last[5] \
            and last[1][rank] == digest
        early = None
        if world > 1:
            mine = np.frombuffer(digest + uid_bytes, dtype=np.uint8)
            table = np.empty((world, mine.size), dtype=np.uint8)
            work = pg.backend.allgather(table, mine, async_op=True)
            try:
                if speculate:
                    early = while_waiting(last[3])
            finally:
                work.wait()
            digests = tuple(table[r, :_DIGEST].tobytes() for r in range(world))
            uid = table[0, _DIGEST:].tobytes().hex()
        else:
            digests, uid = (digest,), uid_bytes.hex()
            if speculate and digests == last[1]:
                early = while_waiting(last[3])
        if last is not None and last[0] is pg and last[1] == digests and last[5]:
            # Same layout on every rank: same plan. Plain values come from rank 0's own state
            # dict (it holds every plain key, so in a full exchange its values would win too).
            self.hits += 1
            objects = {k: {"path": path, "value": value} for k, (path, value) in plan["objects"].items()}
            return uid, last[2], last[3], objects, early
        if world > 1:
            from neural_arch.distributed.collectives import all_gather_object

            plans = [None] * world
            all_gather_object(plans, {"arrays": plan["arrays"], "objects": plan["objects"]}, group=pg)
        else:
            plans = [plan]
        entries, owners, objects = make_plan(plans)
        rank0_has_all = all(set(p["objects"]) <= set(plans[0]["objects"]) for p in plans)
        self._last = (pg, digests, entries, owners, set(objects), rank0_has_all)
        return uid, entries, owners, objects, None

    def clear(self) -> None:
        self._last = None
