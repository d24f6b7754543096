"""Functions the pipeline-generation tests run on every rank of a RankPool (module level: pickled by
reference). Each compares :class:`PipelineGenerator` with ``GPT.generate`` on one process, same weights."""

from __future__ import annotations

import numpy as np

SHAPE = {"vocab_size": 23, "block_size": 16, "n_layer": 3, "n_head": 2, "n_embd": 8}


def _gpt(seed: int):
    from neural_arch import nn
    from neural_arch.core.tensor import manual_seed

    manual_seed(seed)
    return nn.GPT(**SHAPE).double()


def _requests(seed: int):
    """Four requests (micro-batches): one sequence, two sequences, a left-padded pair, one more."""
    rng = np.random.default_rng(seed + 1)
    v = SHAPE["vocab_size"]
    padded = rng.integers(0, v, size=(2, 5))
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    return ([rng.integers(0, v, size=(1, 4)), rng.integers(0, v, size=(2, 3)), np.where(mask == 1, padded, 0),
             rng.integers(0, v, size=(1, 6))], [None, None, mask, None])


def pipeline_generate_run(do_sample: bool, seed: int = 0, max_new_tokens: int = 5):
    """Every request's tokens from the pipeline and from ``GPT.generate`` on the whole model alone."""
    from neural_arch.distributed.pipelining.generation import PipelineGenerator

    prompts, masks = _requests(seed)
    kwargs = {"do_sample": do_sample, "temperature": 0.9, "top_k": 10, "top_p": 0.9}
    gen = PipelineGenerator(_gpt(seed))
    got = gen.generate(prompts, max_new_tokens, attention_masks=masks,
                       generators=[np.random.default_rng(seed + r) for r in range(len(prompts))], **kwargs)
    ref = _gpt(seed)
    want = [ref.generate(q, max_new_tokens, attention_mask=mk, generator=np.random.default_rng(seed + r), **kwargs)
            for r, (q, mk) in enumerate(zip(prompts, masks))]
    return {"got": [g.tolist() for g in got], "want": [w.tolist() for w in want],
            "blocks": (gen.start, gen.stop), "cache_layers": [len(c) for c in gen.caches],
            "cached": [c.get_seq_length() for c in gen.caches], "prompt_lengths": [q.shape[1] for q in prompts],
            "actions": [str(a) for a in gen.actions]}


def pipeline_generate_eos_run(do_sample: bool, seed: int = 0, max_new_tokens: int = 6):
    """With ``eos_token_id``: the tokens (requests ending at different steps) and this stage's actions.

    The end tokens are chosen from a run without them so that requests really end early: request 0's
    second token and request 3's fourth (a request of two sequences ends only when both have)."""
    from neural_arch.distributed.pipelining.generation import PipelineGenerator

    prompts, masks = _requests(seed)
    kwargs = {"do_sample": do_sample, "temperature": 0.9, "top_k": 10, "top_p": 0.9}
    ref = _gpt(seed)

    def reference(eos):
        return [ref.generate(q, max_new_tokens, attention_mask=mk, generator=np.random.default_rng(seed + r),
                             eos_token_id=eos, **kwargs) for r, (q, mk) in enumerate(zip(prompts, masks))]

    free = reference(None)
    eos = [int(free[0][0, prompts[0].shape[1] + 1]), int(free[3][0, prompts[3].shape[1] + 3])]
    gen = PipelineGenerator(_gpt(seed))
    got = gen.generate(prompts, max_new_tokens, attention_masks=masks, eos_token_id=eos,
                       generators=[np.random.default_rng(seed + r) for r in range(len(prompts))], **kwargs)
    return {"got": [g.tolist() for g in got], "want": [w.tolist() for w in reference(eos)],
            "new_tokens": [g.shape[1] - q.shape[1] for g, q in zip(got, prompts)],
            "actions": [str(a) for a in gen.actions], "stage": gen.stage, "stages": gen.num_stages}
