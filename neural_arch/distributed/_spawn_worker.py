"""Child side of :func:`neural_arch.distributed.launch` (``python -m ... _spawn_worker WORKDIR``).

Reads ``WORKDIR/payload.pkl``, sets up the process group, runs ``fn(*args)`` and writes
``result_{rank}.pkl`` (atomically) or ``error_{rank}.txt`` (the traceback) before exiting 1.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import traceback


def _import_main(path: str) -> None:
    # Same trick as multiprocessing's spawn: run the parent's script as "__mp_main__" (so its
    # `if __name__ == "__main__":` block does not run) and let "__main__.fn" resolve to it.
    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    spec.loader.exec_module(module)


def main(workdir: str) -> int:
    from neural_arch.distributed.elastic import atomic_write_bytes
    from neural_arch.distributed.run_env import install_parent_death_watch

    install_parent_death_watch()
    rank = int(os.environ["RANK"])
    group_ready = False
    try:
        with open(os.path.join(workdir, "payload.pkl"), "rb") as f:
            payload = pickle.load(f)
        for entry in payload["sys_path"]:
            if entry not in sys.path:
                sys.path.append(entry)
        if payload["main_path"]:
            _import_main(payload["main_path"])
        fn, args = pickle.loads(payload["fn"])
        if payload["init"]:
            from neural_arch.distributed import init_process_group

            init_process_group(backend=payload["backend"])
            group_ready = True
        result = fn(*args)
        atomic_write_bytes(os.path.join(workdir, f"result_{rank}.pkl"), pickle.dumps(result))
    except BaseException:  # noqa: BLE001 - everything, including SystemExit, goes back to the parent
        try:
            with open(os.path.join(workdir, f"error_{rank}.txt"), "w", encoding="utf-8") as f:
                f.write(traceback.format_exc())
        except OSError:
            pass
        return 1
    finally:
        if group_ready:
            try:
                from neural_arch.distributed import destroy_process_group

                destroy_process_group()
            except Exception:  # noqa: BLE001, S110 - a peer may already be gone; the result is saved
                pass
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m neural_arch.distributed._spawn_worker WORKDIR")
    sys.exit(main(sys.argv[1]))
