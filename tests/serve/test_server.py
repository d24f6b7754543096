"""``python -m neural_arch.serve --checkpoint DIR --tp 2`` under a real HTTP client (urllib), gloo ranks
started by the launcher: greedy tokens equal the single-process model's (JSON and the event stream), and a
seeded sampling request draws what ``GPT.generate`` draws with that seed;
a request arriving while another decodes joins its running batch; bad requests get a 4xx with a
sentence; a SIGKILLed rank fails the request in flight with a 503 and the server exits non-zero.

One server for the module (a start costs a few seconds here); the killed-rank test runs last and
ends it. Every wait has a deadline, and the server's whole session is killed at the end."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from neural_arch.distributed.testing import script_env
from neural_arch.serve.checkpoint import load_checkpoint
from neural_arch.serve.checkpoint import main as make_checkpoint

pytestmark = pytest.mark.timeout(180)

SHAPE = ["--vocab-size", "40", "--block-size", "256", "--n-layer", "2", "--n-head", "4", "--n-embd", "32"]


class Server:
    def __init__(self, folder, tmp):
        self.lines: list[str] = []
        env = script_env({"TMPDIR": str(tmp)})
        self.proc = subprocess.Popen([sys.executable, "-m", "neural_arch.serve", "--checkpoint", str(folder), "--tp",
                                      "2", "--port", "0", "--request-timeout", "60"],
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


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-checkpoint")
    assert make_checkpoint([str(folder), *SHAPE, "--dtype", "float64", "--seed", "5"]) == 0
    return folder


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    s = Server(checkpoint, tmp_path_factory.mktemp("serve-run"))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def reference(checkpoint):
    model, _ = load_checkpoint(checkpoint)

    def generate(prompt, n, **sampling):
        seed = sampling.pop("seed", None)
        if sampling:
            sampling.update(do_sample=True, generator=np.random.default_rng(seed))
        return model.generate(np.array([prompt]), n, **sampling)[0, len(prompt):].tolist()

    return generate


def test_greedy_tokens_equal_single_process_and_config_and_health(server, reference):
    status, health = server.call("/health")
    assert status == 200 and health["status"] == "ok" and health["tp"] == 2 and len(health["pids"]) == 2
    status, config = server.call("/config")
    assert status == 200 and config["model"]["block_size"] == 256 and config["dtype"] == "float64"
    for prompt in ([1, 2, 3], [7] * 9):
        status, out = server.call("/generate", {"prompt": prompt, "max_new_tokens": 7})
        assert status == 200, out
        assert out["tokens"] == reference(prompt, 7) and out["prompt_tokens"] == len(prompt)
    events = list(server.stream({"prompt": [5, 4, 3, 2], "max_new_tokens": 5}))
    assert [e["token"] for e in events[:-1]] == reference([5, 4, 3, 2], 5) == events[-1]["tokens"]
    assert events[-1]["done"] is True
    # sampling: the tp ranks gather the logits and keep rank 0's draw from the request's own generator
    sampling = {"temperature": 0.9, "top_k": 12, "top_p": 0.95, "seed": 4}
    status, out = server.call("/generate", {"prompt": [2, 3], "max_new_tokens": 6, **sampling})
    assert status == 200 and out["tokens"] == reference([2, 3], 6, **sampling)


def test_a_request_joins_the_running_batch(server, reference):
    long_prompt, short_prompt = [3, 1, 4, 1, 5], [9, 2, 6]
    events = server.stream({"prompt": long_prompt, "max_new_tokens": 60})
    first = next(events)                        # the long request is decoding now
    status, short = server.call("/generate", {"prompt": short_prompt, "max_new_tokens": 4})
    rest = list(events)
    long = rest[-1]
    assert status == 200 and long["done"]
    assert [first["token"]] + [e["token"] for e in rest[:-1]] == long["tokens"] == reference(long_prompt, 60)
    assert short["tokens"] == reference(short_prompt, 4)
    # the short request's steps lie inside the long one's: both were in the same decode batches
    assert long["first_step"] < short["first_step"] <= short["last_step"] < long["last_step"], (long, short)


@pytest.mark.parametrize("raw,status,words", [
    (b"{not json", 400, "not valid JSON"),
    (b'{"prompt": [1, 2], "max_tokens": 3}', 400, "unknown parameter 'max_tokens'"),
    (b'{"prompt": [1, 2], "max_new_tokens": 255}', 400, "too long"),
    (b'{"prompt": [1, 99]}', 400, "outside the vocabulary"),
    (b'{"text": "hello"}', 400, "no tokenizer"),
    (b'{"prompt": [1], "temperature": -1}', 400, "temperature"),
    (b"[1, 2]", 400, "JSON object"),
])
def test_bad_requests_get_a_4xx_with_a_sentence(server, raw, status, words):
    got, body = server.call("/generate", raw=raw)
    assert got == status and words in body["error"], body


def test_unknown_path_is_a_404(server):
    assert server.call("/nope")[0] == 404


def test_killed_rank_fails_the_request_in_flight_and_the_server_exits(server):
    """Runs last: it ends the module's server."""
    result = {}

    def ask():
        result["answer"] = server.call("/generate", {"prompt": [1, 2], "max_new_tokens": 250})

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    deadline = time.monotonic() + 30
    while True:
        status, health = server.call("/health")
        if health.get("running"):
            break
        assert time.monotonic() < deadline and "answer" not in result, (health, result)
        time.sleep(0.01)
    os.kill(health["pids"][1], signal.SIGKILL)
    asker.join(timeout=60)
    assert not asker.is_alive()
    status, body = result["answer"]
    assert status == 503 and "shutting down" in body["error"], body
    assert server.proc.wait(timeout=60) != 0
    assert "shutting down" in server.output() and "killed by SIGKILL" in server.output()
