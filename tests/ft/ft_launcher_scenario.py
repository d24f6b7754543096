"""The launcher-restart scenario of per-step fault tolerance, as one process (a background job).

``python ft_launcher_scenario.py OUT NPROC`` starts what docs/fault_tolerance.md and
``examples/ft_train.py`` teach: a lighthouse process (``python -m neural_arch.distributed.ft.lighthouse
--min_replicas 2``) and one launcher per replica group (``--standalone --nproc_per_node NPROC
--max_restarts 2``), replicas ``a`` and ``b``; rank ``NPROC - 1`` of b SIGKILLs itself in step
``KILL_AT`` of its first attempt, so b's launcher restarts b's ranks, which heal from a. It waits for
both launchers, stops the lighthouse, and writes ``OUT/results.json`` (each process's exit status and
output, the quorums the lighthouse printed); the ranks' results are ``OUT/ranks/{replica}.rank{r}.json``.
Exit status 0 when both launchers exited 0. ``tests/ft/test_ft_launcher_restart.py`` judges it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KILL_AT = 3
LIMIT_S = 120.0        # each launcher's whole run


def main(out: Path, nproc: int) -> int:
    from neural_arch.distributed.testing import script_env

    out.mkdir(parents=True, exist_ok=True)
    env = script_env()
    python = sys.executable
    lighthouse = subprocess.Popen([python, "-m", "neural_arch.distributed.ft.lighthouse", "--min_replicas", "2",
                                   "--port", "0"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    launchers: dict[str, subprocess.Popen] = {}
    results: dict = {"nproc": nproc, "kill_at": KILL_AT, "launchers": {}}
    try:
        first = lighthouse.stdout.readline()      # "ft lighthouse listening on HOST:PORT"
        if "listening on" not in first:
            raise RuntimeError(f"the lighthouse did not start: {first!r} {lighthouse.stderr.read()[-2000:]}")
        address = first.split()[-1]
        for replica in ("a", "b"):
            argv = [python, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node",
                    str(nproc), "--max_restarts", "2", str(REPO / "examples" / "ft_train.py"),
                    "--lighthouse", address, "--replica_id", replica, "--out", str(out / "ranks")]
            if replica == "b":
                argv += ["--kill_at_step", str(KILL_AT), "--kill_rank", str(nproc - 1)]
            launchers[replica] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + LIMIT_S
        for replica, proc in launchers.items():
            try:
                stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()                   # the launcher forwards it to its ranks
                stdout, stderr = proc.communicate()
            results["launchers"][replica] = {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr}
    finally:
        for proc in (*launchers.values(), lighthouse):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        rest, errors = lighthouse.communicate()
        results["lighthouse"] = {"returncode": lighthouse.returncode, "stderr": errors,
                                 "quorums": [json.loads(line[len("quorum "):]) for line in rest.splitlines()
                                             if line.startswith("quorum ")]}
        (out / "results.json").write_text(json.dumps(results))
    for replica, done in results["launchers"].items():
        print(f"launcher {replica}: exit {done['returncode']}\n{done['stdout']}{done['stderr']}", file=sys.stderr)
    return 0 if all(done["returncode"] == 0 for done in results["launchers"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
