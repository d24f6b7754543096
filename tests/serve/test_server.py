"""``python -m neural_arch.serve --checkpoint DIR --tp 2`` under a real HTTP client (urllib), gloo ranks
started by the launcher: greedy tokens equal the single-process model's (JSON and the event stream), and a
seeded sampling request draws what ``GPT.generate`` draws with that seed;
a request arriving while another decodes joins its running batch; bad requests get a 4xx with a
sentence; a client that disconnects mid-stream frees its place; a SIGKILLed rank fails the request in
flight with a 503 and the server exits non-zero.

One server for the module (a start costs a few seconds here); the killed-rank test runs last and
ends it. Every wait has a deadline, and the server's whole session is killed at the end."""

import json
import os
import signal
import threading
import time
import urllib.request

import pytest
from serve_client import reference_generator, running

from neural_arch.serve.checkpoint import main as make_checkpoint

pytestmark = pytest.mark.timeout(180)

SHAPE = ["--vocab-size", "40", "--block-size", "256", "--n-layer", "2", "--n-head", "4", "--n-embd", "32"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-checkpoint")
    assert make_checkpoint([str(folder), *SHAPE, "--dtype", "float64", "--seed", "5"]) == 0
    return folder


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    yield from running(checkpoint, tmp_path_factory.mktemp("serve-run"), ["--tp", "2"])


@pytest.fixture(scope="module")
def reference(checkpoint):
    return reference_generator(checkpoint)


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
    # long enough that the short request's HTTP call lands while it decodes, also on a loaded machine (with 60
    # tokens a fresh-clone suite once saw the long one finish at step 84 and the short one start at 85)
    events = server.stream({"prompt": long_prompt, "max_new_tokens": 220})
    first = next(events)                        # the long request is decoding now
    status, short = server.call("/generate", {"prompt": short_prompt, "max_new_tokens": 4})
    rest = list(events)
    long = rest[-1]
    assert status == 200 and long["done"]
    assert [first["token"]] + [e["token"] for e in rest[:-1]] == long["tokens"] == reference(long_prompt, 220)
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


def test_a_client_that_disconnects_mid_stream_frees_its_place(server, reference):
    """The client reads two tokens of a long stream and closes the connection: the request leaves the
    batch within a step or so (the server counts it cancelled), long before its 240 tokens."""
    body = json.dumps({"prompt": [8, 1], "max_new_tokens": 240, "stream": True}).encode()
    req = urllib.request.Request(server.url + "/generate", data=body, headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=60)
    tokens = 0
    for line in resp:
        tokens += line.startswith(b"data: ")
        if tokens == 2:
            break
    _, before = server.call("/health")
    resp.close()
    deadline = time.monotonic() + 30
    while True:
        _, health = server.call("/health")
        if health["running"] == 0 and health["waiting"] == 0:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.01)
    assert health["cancelled"] == before["cancelled"] + 1 and before["running"] == 1, (before, health)
    assert health["steps"] - before["steps"] < 100, (before, health)
    # its place and caches are free, and the next request is served as before
    status, out = server.call("/generate", {"prompt": [8, 1], "max_new_tokens": 5})
    assert status == 200 and out["tokens"] == reference([8, 1], 5)


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
