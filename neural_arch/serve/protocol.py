"""What a generation request may say, checked before it reaches the model.

``POST /generate`` takes a JSON object:

==================  ==========================  ================================================================
field               type (default)              meaning
==================  ==========================  ================================================================
``prompt``          list of int (required)      token ids, each in ``[0, vocab_size)``, at least one
``max_new_tokens``  int >= 1 (16)               tokens to generate; ``len(prompt) + max_new_tokens <= block_size``
``temperature``     finite number >= 0 (0)      0 = greedy (argmax); > 0 samples from ``softmax(logits / T)``
``top_k``           int >= 1 or null (null)     sampling: keep the k most likely tokens
``top_p``           number in (0, 1] or null    sampling: keep the smallest set reaching probability p
``seed``            int or null (null)          sampling: the request's own generator (reproducible draws)
``stream``          bool (false)                true: one server-sent event per token (see ``server``)
``text``            --                          refused: the checkpoint format has no tokenizer; send ids
==================  ==========================  ================================================================

Anything else -- bad JSON, another type, an unknown field, a prompt too long for the model -- is a
:class:`RequestError` whose ``status`` (400, or 413 for a body over :data:`MAX_BODY_BYTES`) and
sentence go back to the client as is.

Example::

    >>> req = parse_request(b'{"prompt": [1, 2], "max_new_tokens": 3}', vocab_size=16, block_size=8)
    >>> req.prompt, req.max_new_tokens, req.sampling
    ([1, 2], 3, False)
    >>> parse_request(b'{"prompt": [1], "colour": 1}', vocab_size=16, block_size=8)
    Traceback (most recent call last):
    ...
    neural_arch.serve.protocol.RequestError: unknown parameter 'colour'; allowed: max_new_tokens, prompt, seed, stream, temperature, text, top_k, top_p
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

__all__ = ["MAX_BODY_BYTES", "GenerationRequest", "RequestError", "parse_request"]

#: The largest request body accepted (a prompt of block_size ids is far below it).
MAX_BODY_BYTES = 1 << 20
_FIELDS = ("max_new_tokens", "prompt", "seed", "stream", "temperature", "text", "top_k", "top_p")


class RequestError(ValueError):
    """A request the server refuses: ``status`` (an HTTP 4xx) and a sentence saying what to change.

    Example::

        >>> RequestError(413, "too big").status
        413
    """

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = int(status)


@dataclass
class GenerationRequest:
    """A checked request (see the module docstring for the fields).

    Example::

        >>> GenerationRequest(prompt=[1, 2]).sampling
        False
    """

    prompt: list
    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool = False

    @property
    def sampling(self) -> bool:
        """True when the request samples (temperature > 0), False for greedy."""
        return self.temperature > 0


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_request(body: bytes, vocab_size: int, block_size: int) -> GenerationRequest:
    """Check a ``POST /generate`` body against the model; raise :class:`RequestError` with a sentence.

    Example::

        >>> parse_request(b'{"prompt": [1, 2, 3], "max_new_tokens": 9}', vocab_size=16, block_size=8)
        Traceback (most recent call last):
        ...
        neural_arch.serve.protocol.RequestError: too long: the prompt's 3 tokens plus max_new_tokens 9 = 12 exceed the model's block_size 8; shorten the prompt or ask for fewer tokens
    """
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"the request body has {len(body)} bytes; at most {MAX_BODY_BYTES} are accepted")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, f"the body is not valid JSON ({exc}); send an object such as "
                                '{"prompt": [1, 2, 3], "max_new_tokens": 8}') from None
    if not isinstance(data, dict):
        raise RequestError(400, f"the body must be a JSON object, got a {type(data).__name__}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise RequestError(400, f"unknown parameter {unknown[0]!r}; allowed: {', '.join(_FIELDS)}")
    if "text" in data:
        raise RequestError(400, "this checkpoint has no tokenizer, so 'text' cannot be encoded; send token ids "
                                "as 'prompt': [id, ...]")
    prompt = data.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(_is_int(t) for t in prompt):
        raise RequestError(400, "'prompt' must be a non-empty list of integer token ids")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    req = GenerationRequest(prompt=list(prompt))
    if "max_new_tokens" in data:
        if not _is_int(data["max_new_tokens"]) or data["max_new_tokens"] < 1:
            raise RequestError(400, f"'max_new_tokens' must be an integer >= 1, got {data['max_new_tokens']!r}")
        req.max_new_tokens = data["max_new_tokens"]
    if len(prompt) + req.max_new_tokens > block_size:
        raise RequestError(400, f"too long: the prompt's {len(prompt)} tokens plus max_new_tokens "
                                f"{req.max_new_tokens} = {len(prompt) + req.max_new_tokens} exceed the model's "
                                f"block_size {block_size}; shorten the prompt or ask for fewer tokens")
    if data.get("temperature") is not None:
        # finite: Infinity (or 1e999) would flatten the logits to 0 and top_k / top_p would keep every token
        if not _is_number(data["temperature"]) or not 0 <= data["temperature"] < math.inf:
            raise RequestError(400, f"'temperature' must be a finite number >= 0 (0 = greedy), got "
                                    f"{data['temperature']!r}")
        req.temperature = float(data["temperature"])
    if data.get("top_k") is not None:
        if not _is_int(data["top_k"]) or data["top_k"] < 1:
            raise RequestError(400, f"'top_k' must be an integer >= 1 or null, got {data['top_k']!r}")
        req.top_k = data["top_k"]
    if data.get("top_p") is not None:
        if not _is_number(data["top_p"]) or not 0 < data["top_p"] <= 1:
            raise RequestError(400, f"'top_p' must be a number in (0, 1] or null, got {data['top_p']!r}")
        req.top_p = float(data["top_p"])
    if data.get("seed") is not None:
        if not _is_int(data["seed"]) or data["seed"] < 0:
            raise RequestError(400, f"'seed' must be a non-negative integer or null, got {data['seed']!r}")
        req.seed = data["seed"]
    if "stream" in data:
        if not isinstance(data["stream"], bool):
            raise RequestError(400, f"'stream' must be true or false, got {data['stream']!r}")
        req.stream = data["stream"]
    return req
