"""``python -m neural_arch.serve --checkpoint DIR --tp 2 --pp 2`` (4 gloo ranks: two pipeline stages of two
tensor-parallel ranks) under a real HTTP client: greedy and seeded sampled tokens equal the
single-process model's, and a request arriving while another decodes joins its running batch.

The stage split leaves the middle block to the first stage (3 blocks over 2 stages), so the stages
differ in depth; the model is float64, so equal tokens follow from equal logits."""

import pytest
from serve_client import reference_generator, running

from neural_arch.serve.checkpoint import main as make_checkpoint

pytestmark = pytest.mark.timeout(180)

SHAPE = ["--vocab-size", "40", "--block-size", "64", "--n-layer", "3", "--n-head", "4", "--n-embd", "32"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-pp-checkpoint")
    assert make_checkpoint([str(folder), *SHAPE, "--dtype", "float64", "--seed", "6"]) == 0
    return folder


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    yield from running(checkpoint, tmp_path_factory.mktemp("serve-pp-run"), ["--tp", "2", "--pp", "2"])


@pytest.fixture(scope="module")
def reference(checkpoint):
    return reference_generator(checkpoint)


def test_tp_and_pp_tokens_equal_single_process(server, reference):
    status, health = server.call("/health")
    assert status == 200 and (health["tp"], len(health["pids"])) == (2, 4), health
    assert server.call("/config")[1]["pp"] == 2
    status, out = server.call("/generate", {"prompt": [1, 2, 3], "max_new_tokens": 7})
    assert status == 200 and out["tokens"] == reference([1, 2, 3], 7), out
    sampling = {"temperature": 0.9, "top_k": 12, "top_p": 0.95, "seed": 4}
    status, out = server.call("/generate", {"prompt": [2, 3], "max_new_tokens": 6, **sampling})
    assert status == 200 and out["tokens"] == reference([2, 3], 6, **sampling), out


def test_a_request_joins_the_running_pipelined_batch(server, reference):
    long_prompt, short_prompt = [3, 1, 4, 1, 5], [9, 2, 6]
    events = server.stream({"prompt": long_prompt, "max_new_tokens": 40})
    first = next(events)
    status, short = server.call("/generate", {"prompt": short_prompt, "max_new_tokens": 4, "temperature": 0.7,
                                              "seed": 1})
    rest = list(events)
    long = rest[-1]
    assert status == 200 and long["done"]
    assert [first["token"]] + [e["token"] for e in rest[:-1]] == long["tokens"] == reference(long_prompt, 40)
    assert short["tokens"] == reference(short_prompt, 4, temperature=0.7, seed=1)
    assert long["first_step"] < short["first_step"] <= short["last_step"] < long["last_step"], (long, short)
