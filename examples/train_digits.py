"""Train a small MLP on scikit-learn's 8x8 digits with neural_arch, on one CPU core, in seconds.

Usage::

    python examples/train_digits.py                 # 15 epochs, about 97% test accuracy
    python examples/train_digits.py --epochs 5 --lr 3e-3 --batch-size 32 --seed 1

The loop is the usual one: DataLoader -> model -> CrossEntropyLoss -> backward -> AdamW step,
with a cosine learning-rate schedule. Needs scikit-learn for the data set
(``pip install neural_arch[examples]``); tqdm is optional (plain prints without it).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

try:
    import neural_arch  # noqa: F401
except ImportError:  # running from a source checkout without `pip install -e .`
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from neural_arch import nn, optim
from neural_arch.core.tensor import manual_seed, no_grad
from neural_arch.data import DataLoader, TensorDataset, load_digits

try:
    from tqdm import tqdm
except ImportError:  # tqdm is optional
    tqdm = None


def build_model(hidden: int = 128) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy of ``model`` on ``(x, y)`` (eval mode, no graph)."""
    model.eval()
    with no_grad():
        predictions = model(x).data.argmax(axis=1)
    model.train()
    return float((predictions == y).mean())


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS threads (default 1: the matrices are tiny, more threads only add "
                             "overhead; 0 leaves the BLAS default); needs threadpoolctl")
    parser.add_argument("--no-progress", action="store_true", help="plain prints instead of a progress bar")
    return parser.parse_args(argv)


def main(argv=None) -> float:
    """Train, print progress and the final test accuracy; return that accuracy."""
    args = parse_args(argv)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return train(args)
    with threadpool_limits(limits=args.threads if args.threads > 0 else None):
        return train(args)


def train(args: argparse.Namespace) -> float:
    """The training run itself (``main`` only sets up the BLAS thread limit)."""
    manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(seed=args.seed)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True,
                        seed=args.seed)
    model = build_model(args.hidden)
    opt = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = optim.CosineAnnealingWarmup(opt, warmup_steps=len(loader), total_steps=args.epochs * len(loader))
    loss_fn = nn.CrossEntropyLoss()

    use_bar = tqdm is not None and not args.no_progress
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        batches = tqdm(loader, desc=f"epoch {epoch}/{args.epochs}", leave=False) if use_bar else loader
        total, count = 0.0, 0
        for xb, yb in batches:
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.item()) * len(yb)
            count += len(yb)
            if use_bar:
                batches.set_postfix(loss=f"{total / count:.4f}")
        accuracy = evaluate(model, x_test, y_test)
        msg = f"epoch {epoch:3d}  train loss {total / count:.4f}  test acc {accuracy:.4f}"
        (tqdm.write if use_bar else print)(msg)
    accuracy = evaluate(model, x_test, y_test)
    print(f"trained {args.epochs} epochs in {time.perf_counter() - start:.1f} s")
    print(f"final test accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    main()
    sys.exit(0)
