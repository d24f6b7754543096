"""``python -m neural_arch.distributed.flight_recorder DIR [--world-size N] [--json]``: the verdict
on a folder of flight-recorder dumps, then one line per rank.

Example::

    python -m neural_arch.distributed.flight_recorder /tmp/fr
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from neural_arch.distributed.flight_recorder.analyzer import analyze, load_dumps


def main(argv: list | None = None) -> int:
    """Print the analyzer's report; exit status 1 when the folder holds no dump.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as empty:
    ...     main([empty])
    no flight-recorder dumps (rank<R>.json) in ...
    1
    """
    parser = argparse.ArgumentParser(prog="python -m neural_arch.distributed.flight_recorder",
                                     description="Find where the ranks' collective histories split.")
    parser.add_argument("folder", help="folder of rank<R>.json dumps (NEURAL_ARCH_FLIGHT_RECORDER_DIR)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks the job had (default: what the dumps say); ranks without a dump are named")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    args = parser.parse_args(argv)
    dumps = load_dumps(args.folder)
    if not dumps:
        print(f"no flight-recorder dumps (rank<R>.json) in {args.folder}")
        return 1
    verdict = analyze(dumps, args.world_size)
    if args.json:
        out = dataclasses.asdict(verdict)
        out["last_completed"] = {",".join(map(str, g)): v for g, v in verdict.last_completed.items()}
        print(json.dumps(out, default=str, indent=1))
    else:
        print(verdict.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
