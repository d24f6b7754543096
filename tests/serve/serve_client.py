"""A real server for the serving tests: started as a user starts it, spoken to with ``urllib``."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from neural_arch.distributed.testing import script_env


class Server:
    """``python -m neural_arch.serve --checkpoint folder <layout>`` in its own session, its output collected."""

    def __init__(self, folder, tmp, layout):
        self.lines: list[str] = []
        env = script_env({"TMPDIR": str(tmp)})
        self.proc = subprocess.Popen([sys.executable, "-m", "neural_arch.serve", "--checkpoint", str(folder), *layout,
                                      "--port", "0", "--request-timeout", "60"],
                                     env=env, cwd=str(tmp), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.url = None

    def wait_ready(self):
        deadline = time.monotonic() + 90
        while self.url is None:
            assert time.monotonic() < deadline and self.proc.poll() is None, f"no server: {self.output()}"
            for line in list(self.lines):
                if "listening on http://" in line:
                    self.url = line.split("listening on ")[1].split()[0]
            time.sleep(0.05)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def call(self, path, body=None, raw=None, timeout=60):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stream(self, body, timeout=60):
        """Yield the parsed ``data:`` events of a streaming request."""
        req = urllib.request.Request(self.url + "/generate", data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            assert resp.headers["Content-Type"] == "text/event-stream"
            for line in resp:
                if line.startswith(b"data: "):
                    yield json.loads(line[6:])

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)


def running(checkpoint, tmp, layout):
    """A module fixture's body: a ready :class:`Server`, stopped (its session killed) however the tests end."""
    server = Server(checkpoint, tmp, layout)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def reference_generator(checkpoint):
    """``generate(prompt, n, **sampling)``: the checkpoint's model generating in this process (greedy,
    or sampled with ``seed``), the tokens a server's reply must equal."""
    import numpy as np

    from neural_arch.serve.checkpoint import load_checkpoint

    model, _ = load_checkpoint(checkpoint)

    def generate(prompt, n, **sampling):
        seed = sampling.pop("seed", None)
        if sampling:
            sampling.update(do_sample=True, generator=np.random.default_rng(seed))
        return model.generate(np.array([prompt]), n, **sampling)[0, len(prompt):].tolist()

    return generate
