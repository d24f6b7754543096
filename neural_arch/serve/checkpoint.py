"""The serving checkpoint: a folder with the model's configuration and its whole (unsharded) weights.

::

    DIR/config.json          {"format": "neural_arch.serve/1", "model": {GPT's constructor arguments},
                              "dtype": "float32" | "float64"}
    DIR/model.safetensors    model.state_dict(), written by neural_arch.save (safetensors, no pickle)

Why this and not the training checkpoints: ``examples/train_gpt_*.py`` write an ``.npz`` of the
state dict without the model's shape, and ``neural_arch.distributed.checkpoint`` writes one shard per
rank laid out for the training job's parallelism. A server needs to rebuild the model from the folder
alone and re-shard it for *its* tensor-parallel size, so it keeps the config beside the whole weights;
each rank loads them and ``parallelize_gpt`` keeps its slice. Write one from a trained model with
:func:`save_checkpoint`, or a randomly initialised one (tests, benchmarks) from the command line::

    python -m neural_arch.serve.checkpoint DIR --vocab-size 64 --block-size 128 --n-layer 2 --n-head 4 --n-embd 32

Example::

    >>> import tempfile
    >>> from neural_arch import nn
    >>> folder = tempfile.mkdtemp()
    >>> save_checkpoint(nn.GPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8), folder)
    >>> model, config = load_checkpoint(folder)
    >>> config["model"]["vocab_size"], model.block_size
    (16, 8)
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from neural_arch.nn.transformer import GPT
from neural_arch.utils.atomic_file import atomic_write_bytes

__all__ = ["FORMAT", "load_checkpoint", "read_config", "save_checkpoint"]

FORMAT = "neural_arch.serve/1"
_MODEL_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")


def save_checkpoint(model: GPT, folder: str | os.PathLike) -> None:
    """Write ``model`` (an ``nn.GPT`` with dense MLPs, not parallelized) to ``folder`` (created if needed).

    Example::

        >>> import tempfile
        >>> from neural_arch import nn
        >>> save_checkpoint(nn.GPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8), tempfile.mkdtemp())
    """
    from neural_arch.serialization import save

    if not isinstance(model, GPT) or getattr(model, "moe_num_experts", 0):
        raise TypeError("save_checkpoint: the server serves an nn.GPT with dense MLPs; got "
                        f"{type(model).__name__}")
    os.makedirs(folder, exist_ok=True)
    dtype = str(next(iter(model.parameters())).data.dtype)
    config = {"format": FORMAT, "model": {k: int(getattr(model, k)) for k in _MODEL_KEYS}, "dtype": dtype}
    save({k: np.asarray(v.data if hasattr(v, "data") else v) for k, v in model.state_dict().items()},
         os.path.join(folder, "model.safetensors"))
    atomic_write_bytes(os.path.join(folder, "config.json"), json.dumps(config, indent=1).encode())


def read_config(folder: str | os.PathLike) -> dict:
    """``DIR/config.json``, checked; a missing or foreign folder raises ``ValueError`` saying what to do.

    Example::

        config = read_config("ckpt")          # {"format": ..., "model": {...}, "dtype": "float32"}
    """
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist: --checkpoint must be a folder written by save_checkpoint() "
                         "or `python -m neural_arch.serve.checkpoint DIR ...`") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ValueError(f"{path}: format is {config.get('format') if isinstance(config, dict) else None!r}, "
                         f"expected {FORMAT!r}")
    missing = [k for k in _MODEL_KEYS if not isinstance(config.get("model", {}).get(k), int)]
    if missing:
        raise ValueError(f"{path}: the model entry lacks integer {missing}")
    return config


def load_checkpoint(folder: str | os.PathLike) -> tuple[GPT, dict]:
    """Rebuild the ``nn.GPT`` of ``folder``, weights loaded; returns ``(model, config)``.

    Example::

        model, config = load_checkpoint("ckpt")       # then parallelize_gpt(model, tp_group) on each rank
    """
    from neural_arch.serialization import load

    config = read_config(folder)
    model = GPT(**config["model"])
    if config.get("dtype") == "float64":
        model = model.double()
    state = load(os.path.join(folder, "model.safetensors"))
    model.load_state_dict(state)
    model.eval()
    return model, config


def main(argv=None) -> int:
    """``python -m neural_arch.serve.checkpoint DIR [--vocab-size ...]``: write a randomly initialised GPT."""
    p = argparse.ArgumentParser(prog="python -m neural_arch.serve.checkpoint",
                                description="Write a serving checkpoint of a randomly initialised GPT.")
    p.add_argument("folder")
    for name, default in (("vocab-size", 64), ("block-size", 128), ("n-layer", 2), ("n-head", 4), ("n-embd", 32),
                          ("seed", 0)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = p.parse_args(argv)
    from neural_arch.core.tensor import manual_seed

    manual_seed(args.seed)
    model = GPT(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                n_embd=args.n_embd)
    if args.dtype == "float64":
        model = model.double()
    save_checkpoint(model, args.folder)
    print(f"wrote {args.folder}/config.json and model.safetensors ({args.dtype}, seed {args.seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
