"""Solution to notebook 14's exercise: one accumulation window of a DDP model by hand.

Every micro-batch but the last runs under ``ddp.no_sync()``: its gradients add up locally and
nothing travels. The last backward all-reduces the accumulated sum (DDP averages over ranks). Each
loss is divided by the number of micro-batches, so the sum of the gradients is the gradient of the
window's mean loss; then clip the global norm, step and zero.
"""

import contextlib


def accumulation_window(ddp, optimizer, micro_batches, loss_fn, max_norm):
    from neural_arch.optim.clip import clip_grad_norm_

    k, total = len(micro_batches), 0.0
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = loss_fn(ddp(x), y)
            (loss / k).backward()
        total += float(loss.item()) / k
    clip_grad_norm_(ddp.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad()
    return total
