"""``python -m neural_arch.serve --checkpoint DIR --tp 2 [--pp 2] [--port P]``: serve a GPT over HTTP.

Starts ``--tp`` times ``--pp`` ranks on this machine through the launcher (``--standalone``: a free rendezvous port;
the first rank to fail stops the others, and the exit status is that rank's), each running
:mod:`neural_arch.serve.worker`; rank 0 answers HTTP on ``--host:--port``. Every other option goes to
the worker (``--max-batch``, ``--max-prefill-tokens``, ``--heartbeat``, ``--request-timeout``, ``--verbose``).

Example::

    python -m neural_arch.serve.checkpoint ckpt --n-layer 2 --n-head 4 --n-embd 32    # a random GPT
    python -m neural_arch.serve --checkpoint ckpt --tp 2 --port 8000
    curl -s localhost:8000/generate -H 'Content-Type: application/json' -d '{"prompt": [1, 2, 3], "max_new_tokens": 8}'
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    """Parse ``--tp`` (and ``--backend``), check the checkpoint, launch the ranks; returns the launcher's status."""
    from neural_arch.distributed.launcher import DistributedLauncher
    from neural_arch.distributed.run.launch_config import LaunchConfig
    from neural_arch.serve.checkpoint import read_config
    from neural_arch.serve.worker import parse_args

    p = argparse.ArgumentParser(prog="python -m neural_arch.serve", add_help=False)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (processes) per pipeline stage")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (each holds a share of the blocks)")
    p.add_argument("--backend", default="gloo", help="communication backend of the ranks (default gloo)")
    p.add_argument("-h", "--help", action="store_true")
    ours, rest = p.parse_known_args(argv)
    if ours.help:
        print(__doc__)
        parse_args(["--help"])
    worker_args = parse_args(rest)          # fails here (status 2) on a bad option, before any rank starts
    if ours.tp < 1 or ours.pp < 1:
        print(f"--tp {ours.tp} --pp {ours.pp}: start at least one rank", file=sys.stderr)
        return 2
    try:
        model_config = read_config(worker_args.checkpoint)["model"]
    except ValueError as exc:
        print(f"python -m neural_arch.serve: {exc}", file=sys.stderr)
        return 2
    heads, block = model_config["n_head"], model_config["block_size"]
    if model_config["n_layer"] < ours.pp:
        print(f"--pp {ours.pp} is more stages than the model's {model_config['n_layer']} blocks", file=sys.stderr)
        return 2
    if worker_args.max_prefill_tokens is not None and worker_args.max_prefill_tokens < block:
        print(f"--max-prefill-tokens {worker_args.max_prefill_tokens} is below the model's block_size {block}: a "
              "long prompt could never join; leave it out or raise it", file=sys.stderr)
        return 2
    if heads % ours.tp:
        print(f"--tp {ours.tp} does not divide the model's {heads} heads; pick a divisor", file=sys.stderr)
        return 2
    config = LaunchConfig(nproc_per_node=ours.tp * ours.pp, standalone=True, module=True, backend=ours.backend,
                          monitor_interval=0.2, term_timeout=5.0)
    return DistributedLauncher(config).launch("neural_arch.serve.worker", *rest, "--pp", str(ours.pp))


if __name__ == "__main__":
    raise SystemExit(main())
