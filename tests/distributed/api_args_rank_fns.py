"""Rank functions for test_api_args_explore.py (module level: the pool pickles them by reference).

Each error scenario returns ``(exception type name, message)`` per rank (``("ok", value)`` when the
call returned), so the test sees every rank's outcome, and finishes with an all-reduce: the group
must still be usable after a rejected call (after ``recv_shape``, which poisons it by design, it is
started again).
"""

from __future__ import annotations

import numpy as np

import neural_arch.distributed as dist
from neural_arch.core.tensor import Tensor


def _outcome(fn):
    try:
        return "ok", fn()
    except Exception as err:  # noqa: BLE001 - the test inspects the type and message
        return type(err).__name__, str(err)


def _healthy() -> float:
    return float(dist.all_reduce(np.ones(1)).sum())


def all_to_all_single_run(counts, dtype, tail):
    """Rank s sends ``counts[s][d]`` rows to rank d; rows carry (source, destination, k) labels."""
    r = dist.get_rank()
    w = dist.get_world_size()
    counts = np.asarray(counts)
    rows = [(r, d, k) for d in range(w) for k in range(counts[r][d])]
    inp = np.zeros((len(rows),) + tuple(tail), dtype=dtype)
    for i, (s, d, k) in enumerate(rows):
        inp[i] = 100 * s + 10 * d + k
    out = np.full((int(counts[:, r].sum()),) + tuple(tail), -1, dtype=dtype)
    as_tensor = r % 2 == 1  # both spellings: arrays and Tensors
    result = dist.all_to_all_single(Tensor(out) if as_tensor else out, Tensor(inp) if as_tensor else inp,
                                    output_split_sizes=counts[:, r].tolist(), input_split_sizes=counts[r].tolist())
    got = result.data if as_tensor else out
    return got.tolist()


def scatter_gather_run(shape, dtype, root):
    r, w = dist.get_rank(), dist.get_world_size()
    chunks = [np.full(shape, 10 * k + 1, dtype=dtype) for k in range(w)]
    mine = dist.scatter(np.zeros(shape, dtype=dtype), chunks if r == root else None, src=root)
    outs = [np.zeros(shape, dtype=dtype) for _ in range(w)] if r == root else None
    got = dist.gather(np.full(shape, r, dtype=dtype), outs, dst=root)
    flat = dist.all_gather_into_tensor(np.zeros((w * (shape[0] if shape else 1),) + tuple(shape[1:]), dtype=dtype),
                                       np.full(shape, r, dtype=dtype))
    rs = np.zeros(shape, dtype=dtype)
    dist.reduce_scatter_tensor(rs, np.concatenate([np.full(shape or (1,), k + 1, dtype=dtype) for k in range(w)])
                               .reshape((w * (shape[0] if shape else 1),) + tuple(shape[1:])))
    return (mine.tolist(), None if got is None else [g.tolist() for g in got], flat.tolist(), rs.tolist())


def error_cases_run(case):
    """One bad call (the same on every rank unless the case says otherwise), then a health check."""
    r, w = dist.get_rank(), dist.get_world_size()
    x = np.zeros(2 * w)
    cases = {
        "split_len": lambda: dist.all_to_all_single(x.copy(), x, [2] * w, [2] * (w + 1)),
        "split_sum": lambda: dist.all_to_all_single(x.copy(), x, [2] * w, [1] * w),
        "split_negative": lambda: dist.all_to_all_single(x.copy(), x, [2] * w, [2 * w + 1, -1] + [0] * (w - 2)),
        "split_dtype": lambda: dist.all_to_all_single(x.astype(np.float32), x, [2] * w, [2] * w),
        "split_peers_disagree": lambda: dist.all_to_all_single(
            x.copy(), x, [2] * w, ([1, 3] + [2] * (w - 2)) if r == 0 else [2] * w),
        "scatter_list_len": lambda: dist.scatter(np.zeros(2), [np.zeros(2)] * (w + 1) if r == 0 else None, src=0),
        "scatter_list_shape": lambda: dist.scatter(np.zeros(2), [np.zeros(3)] * w if r == 0 else None, src=0),
        "scatter_list_missing": lambda: dist.scatter(np.zeros(2), None, src=0),
        "gather_list_len": lambda: dist.gather(np.zeros(2), [np.zeros(2)] * (w - 1) if r == w - 1 else None, dst=w - 1),
        "gather_list_dtype": lambda: dist.gather(np.zeros(2), [np.zeros(2, np.float32)] * w if r == 0 else None, dst=0),
        "agit_output_shape": lambda: dist.all_gather_into_tensor(np.zeros(2 * w + 1), np.zeros(2)),
        "agit_output_dtype": lambda: dist.all_gather_into_tensor(np.zeros(2 * w, np.float32), np.zeros(2)),
        "rst_input_shape": lambda: dist.reduce_scatter_tensor(np.zeros(2), np.ones(2 * w + 1)),
        "rst_output_noncontiguous": lambda: dist.reduce_scatter_tensor(np.zeros(4)[::2], np.ones(2 * w)),
        "bol_not_list": lambda: dist.broadcast_object_list((1, 2), src=0),
        "bol_src_range": lambda: dist.broadcast_object_list([1], src=w),
        "ago_len": lambda: dist.all_gather_object([None] * (w + 1), r),
        "gather_object_list_len": lambda: dist.gather_object(r, [None] * (w + 1) if r == 0 else None, dst=0),
        "scatter_object_list_len": lambda: dist.scatter_object_list([None], [1] * (w - 1) if r == w - 1 else None,
                                                                    src=w - 1),
        "send_tag": lambda: dist.send(np.zeros(2), dst=(r + 1) % w, tag=-1),
        "send_dst_range": lambda: dist.send(np.zeros(2), dst=w),
        "send_self": lambda: dist.send(np.zeros(2), dst=r),
        "recv_shape": lambda: dist.send(np.zeros(2), dst=1) if r == 0 else
        (dist.recv(np.zeros(3), src=0) if r == 1 else None),
        "broadcast_peer_shape": lambda: dist.broadcast(np.zeros(2 if r == 0 else 3), src=0),
    }
    outcome = _outcome(cases[case])
    if case == "recv_shape":
        # a mismatch found once data moved poisons the group by design: start it again for the next case
        dist.destroy_process_group()
        dist.init_process_group()
    return outcome if outcome[0] != "ok" else ("ok", None), _healthy()
