"""What every rank of the server runs (started by the launcher: ``python -m neural_arch.serve`` does it).

Every rank joins the process group the launcher describes, loads the checkpoint and keeps its
tensor-parallel slice (``parallelize_gpt``), then:

* **rank 0** serves HTTP (``server``) and steps the batch (``batcher``): plan, broadcast the plan,
  run the step, hand out the tokens; when nothing is running it broadcasts an empty plan every
  ``heartbeat`` seconds;
* **every other rank** receives each plan and runs the same step on its shard.

With ``--pp P`` the ranks form ``P`` pipeline stages of ``size / P`` tensor-parallel ranks each
(``pipeline_stage``): every rank still receives each plan, and runs its stage's blocks of the step.

When a step fails on rank 0 (a peer died: its socket closed; or a collective timed out), or rank 0
is told to stop (SIGTERM/SIGINT: the launcher sends it when another rank exited), every request in
flight or waiting gets a 503 saying so, rank 0 prints the reason, and exits non-zero; the launcher
then stops the rest. Nothing waits without a deadline: collectives have the backend's timeout,
requests ``--request-timeout``.

Example::

    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 2 -m neural_arch.serve.worker \\
        --checkpoint ckpt --port 8000         # what `python -m neural_arch.serve --checkpoint ckpt --tp 2` runs
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np

__all__ = ["main", "parse_args"]

PREFIX = "neural_arch.serve:"


class _Stopped(Exception):
    """Rank 0 got SIGTERM or SIGINT."""


def parse_args(argv=None) -> argparse.Namespace:
    """The options ``python -m neural_arch.serve`` passes on to every rank.

    Example::

        >>> parse_args(["--checkpoint", "ckpt"]).max_batch
        8
    """
    p = argparse.ArgumentParser(prog="python -m neural_arch.serve.worker")
    p.add_argument("--checkpoint", required=True, help="folder written by save_checkpoint()")
    p.add_argument("--host", default="127.0.0.1", help="address rank 0 listens on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0 = any free one; the line 'listening on' says which)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together at most (default 8)")
    p.add_argument("--max-prefill-tokens", type=int, default=None,
                   help="prompt tokens that join in one step at most (default and least: the model's block_size)")
    p.add_argument("--heartbeat", type=float, default=0.5,
                   help="seconds between empty steps while idle (bounds how late a dead rank is noticed)")
    p.add_argument("--request-timeout", type=float, default=120.0,
                   help="seconds a request may wait for its next token before a 504 (default 120)")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline stages; the ranks' count over pp is the tensor-parallel size (default 1)")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request")
    return p.parse_args(argv)


def _setup(args):
    import neural_arch.distributed as dist
    from neural_arch.serve.checkpoint import load_checkpoint
    from neural_arch.serve.decode_step import DecodeEngine

    dist.init_process_group()
    group = dist.get_default_group() if dist.is_initialized() else None
    size = 1 if group is None else group.size()
    model, config = load_checkpoint(args.checkpoint)
    stage, tp_group = None, group
    if args.pp > 1:
        from neural_arch.serve.pipeline_stage import PipelineStage

        stage = PipelineStage(group, len(model.blocks), args.pp)
        # every rank makes every stage's tensor-parallel group (ranks s*tp .. s*tp + tp - 1), keeps its own
        tp_group = dist.new_subgroups_by_enumeration(
            [list(range(s * stage.tp, (s + 1) * stage.tp)) for s in range(args.pp)])[0] if stage.tp > 1 else None
    if tp_group is not None and tp_group.size() > 1:
        from neural_arch.distributed.tensor.parallel import parallelize_gpt

        parallelize_gpt(model, tp_group, loss_parallel=True)
    pids = np.array([os.getpid()], dtype=np.int64)
    if size > 1:
        table = np.zeros((size, 1), dtype=np.int64)
        group.backend.allgather(table, pids)
        pids = table[:, 0]
    return group, DecodeEngine(model, stage=stage), config, [int(p) for p in pids]


def _prefill_budget(args, config) -> int:
    """``--max-prefill-tokens``, at least the block size (every prompt must fit a step alone)."""
    block = int(config["model"]["block_size"])
    budget = block if args.max_prefill_tokens is None else int(args.max_prefill_tokens)
    if budget < block:
        raise SystemExit(f"{PREFIX} --max-prefill-tokens {budget} is below the model's block_size {block}: a "
                         "long prompt could never join; leave it out or raise it")
    return budget


def _lead(args, group, engine, config, pids) -> int:
    from neural_arch.serve.batcher import STOP, ContinuousBatcher, StepPlan, broadcast_plan, plan_capacity
    from neural_arch.serve.server import ServingServer

    budget = _prefill_budget(args, config)
    capacity = plan_capacity(args.max_batch, budget)
    batcher = ContinuousBatcher(args.max_batch, budget)
    info = {"model": config["model"], "dtype": config.get("dtype"), "tp": len(pids) // args.pp, "pp": args.pp,
            "pids": pids, "max_batch": args.max_batch, "max_prefill_tokens": budget,
            "checkpoint": os.path.abspath(args.checkpoint), "stream": "text/event-stream (server-sent events)"}
    server = ServingServer((args.host, args.port), batcher, info, request_timeout=args.request_timeout,
                           verbose=args.verbose)
    stopping = {"signal": None}

    def on_signal(signum, frame):
        if stopping["signal"] is None:
            stopping["signal"] = signum
            raise _Stopped(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    server.start()
    print(f"{PREFIX} listening on http://{args.host}:{server.port} (tp={len(pids) // args.pp}, pp={args.pp}, "
          f"max_batch={args.max_batch}, "
          f"checkpoint {args.checkpoint})", flush=True)
    code, peers_alive = 0, True
    try:
        while True:
            plan = batcher.next_plan(args.heartbeat)
            broadcast_plan(group, plan, capacity)
            batcher.deliver(plan, engine.step(plan, batcher.sample_token))
    except _Stopped as exc:
        code = 128 + int(stopping["signal"])
        why = (f"rank 0 got {exc} (the launcher forwards its own SIGINT/SIGTERM, and sends SIGTERM to every rank "
               "when one of them exits: see its summary); the server is shutting down")
    except Exception as exc:  # noqa: BLE001 - any failure of a step ends the server, said once
        code, peers_alive = 1, False
        why = (f"a model rank failed at step {batcher.step_index}: {type(exc).__name__}: {exc}; "
               "the server is shutting down")
    # the launcher's SIGTERM (another rank exited) may come now: it must not cut the 503s short, and the
    # launcher's SIGKILL after its term_timeout bounds this drain anyway
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    failed = batcher.fail_all(503, why)
    print(f"{PREFIX} {why} ({len(failed)} request(s) in flight or waiting got a 503)", file=sys.stderr, flush=True)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(not a.events.empty() for a in failed):
        time.sleep(0.01)   # each HTTP thread takes its request's error event, then writes the 503
    time.sleep(0.05)
    server.close()
    if peers_alive and group is not None and group.size() > 1:
        try:  # stopped by a signal with every rank alive: let the others end cleanly too
            broadcast_plan(group, StepPlan(STOP, batcher.step_index), capacity)
        except Exception:  # noqa: BLE001, S110 - a peer that is already gone needs no goodbye
            pass
    return code


def _follow(args, group, engine, config) -> int:
    from neural_arch.serve.batcher import STOP, plan_capacity, receive_plan

    capacity = plan_capacity(args.max_batch, _prefill_budget(args, config))
    while True:
        plan = receive_plan(group, capacity)
        if plan.kind == STOP:
            return 0
        engine.step(plan)


def main(argv=None) -> int:
    """One rank of the server; returns its exit status (0 after a clean stop, 128+N after signal N, 1
    after a failed step).

    Example::

        raise SystemExit(main(["--checkpoint", "ckpt", "--port", "8000"]))   # on each rank the launcher starts
    """
    args = parse_args(argv)
    group, engine, config, pids = _setup(args)
    if group is None or group.rank() == 0:
        return _lead(args, group, engine, config, pids)
    # the launcher forwards SIGINT/SIGTERM to every rank: rank 0 says why; the others end without a traceback
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return _follow(args, group, engine, config)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


if __name__ == "__main__":
    raise SystemExit(main())
