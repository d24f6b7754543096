"""``pipeline()`` splitting, in one process: stages share the model's parameters and names, the
composition of the stages is the model, and ``balance`` picks sensible split points."""

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.distributed.pipelining import pipeline
from neural_arch.distributed.pipelining.split import balanced_split_points, even_split_points


def _run(pipe, x):
    for stage in pipe:
        x = stage(x)
    return x.data


def test_sequential_split_is_the_model():
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(5, 5, dtype=np.float64), nn.Tanh())])
    pipe = pipeline(model, split_points=[3, 5])
    x = np.random.default_rng(0).normal(size=(3, 5))
    assert np.array_equal(_run(pipe, x), model(x).data)
    names = [n for stage in pipe for n, _ in stage.named_parameters()]
    assert names == [n for n, _ in model.named_parameters()]
    assert all(p is q for p, q in zip([p for s in pipe for p in s.parameters()], model.parameters()))


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
def test_gpt_split_is_the_model(num_stages):
    model = nn.GPT(vocab_size=13, block_size=5, n_layer=4, n_head=2, n_embd=8).double()
    pipe = pipeline(model, num_stages=num_stages, balance="layers")
    x = np.random.default_rng(1).integers(0, 13, size=(2, 5))
    assert np.array_equal(_run(pipe, x), model(x).data)
    assert sorted(n for s in pipe for n, _ in s.named_parameters()) == sorted(n for n, _ in model.named_parameters())
    assert "tok_emb.weight" in dict(pipe[0].named_parameters())
    assert "head.weight" in dict(pipe[num_stages - 1].named_parameters())


def test_balance_params_vs_layers():
    model = nn.Sequential(nn.Linear(2, 100), nn.Linear(100, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    assert pipeline(model, num_stages=2, balance="layers").split_points == [2]
    assert pipeline(model, num_stages=2, balance="params").split_points == [1]
    assert balanced_split_points([1, 1, 1, 1, 10], 2) == [4]
    assert even_split_points(7, 3) == [3, 5]


@pytest.mark.parametrize("kwargs, err, match", [
    ({}, ValueError, "exactly one of"),
    ({"num_stages": 2, "split_points": [1]}, ValueError, "exactly one of"),
    ({"num_stages": 9}, ValueError, "num_stages=9"),
    ({"split_points": [2, 2]}, ValueError, "strictly increasing"),
    ({"split_points": [0]}, ValueError, "strictly increasing"),
    ({"num_stages": 2, "balance": "flops"}, ValueError, "balance="),
])
def test_bad_split_arguments(kwargs, err, match):
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    with pytest.raises(err, match=match):
        pipeline(model, **kwargs)


def test_unsplittable_module():
    with pytest.raises(TypeError, match="Sequential or nn.GPT"):
        pipeline(nn.Linear(2, 2), num_stages=1)
