"""Learning-rate schedules: ``StepLR`` and ``CosineAnnealingWarmup`` (linear warm-up, cosine decay).

Call ``scheduler.step()`` once per optimizer step (or per epoch for ``StepLR``, as you prefer);
the new rate is written into every ``param_group["lr"]``. Each schedule is a closed-form function
of the step count, so resuming from ``state_dict()`` gives exactly the same rates.

Example::

    >>> from neural_arch import nn, optim
    >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    >>> sched = optim.lr_scheduler.CosineAnnealingWarmup(opt, warmup_steps=2, total_steps=6)
    >>> rates = []
    >>> for _ in range(6):
    ...     rates.append(round(sched.get_last_lr()[0], 3)); opt.step(); sched.step()
    >>> rates
    [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
"""

from __future__ import annotations

import math

from neural_arch.optim.optimizer import Optimizer

__all__ = ["CosineAnnealingWarmup", "CosineWithWarmup", "LRScheduler", "LambdaLR", "StepLR"]


class LRScheduler:
    """Base class: subclasses implement ``lr_at(base_lr, step)``; ``last_epoch`` counts ``step()`` calls.

    Like torch, construction performs step 0 (sets ``group["lr"]`` to the schedule's first value)
    and records each group's starting rate as ``group["initial_lr"]``.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__} needs an Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(
                    "param 'initial_lr' is not set in param_groups when resuming (last_epoch != -1); "
                    "load the scheduler's state_dict instead"
                )
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr: float, step: int) -> float:
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    def step(self) -> None:
        """Advance one step and write the new rates into the optimizer."""
        self.last_epoch += 1
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        """The rates set by the latest ``step()`` (one per param group)."""
        return list(self._last_lr)

    def state_dict(self) -> dict:
        """Everything except the optimizer (save that with ``optimizer.state_dict()``)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


class StepLR(LRScheduler):
    """Multiply the rate by ``gamma`` every ``step_size`` steps: ``base * gamma ** (step // step_size)``."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if int(step_size) <= 0:
            raise ValueError(f"StepLR: step_size must be a positive integer, got {step_size}")
        self.step_size = int(step_size)
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.gamma ** (step // self.step_size)


class CosineAnnealingWarmup(LRScheduler):
    """Linear warm-up to the base rate, then half a cosine down to ``min_lr`` at ``total_steps``.

    For step s (0-based count of ``step()`` calls): during warm-up ``base * (s + 1) / warmup_steps``
    (so the very first update already moves), then
    ``min_lr + (base - min_lr) * (1 + cos(pi * p)) / 2`` with ``p = (s - warmup) / (total - warmup)``,
    held at ``min_lr`` after ``total_steps``.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr: float = 0.0,
                 last_epoch: int = -1):
        if int(warmup_steps) < 0 or int(total_steps) <= 0 or int(warmup_steps) > int(total_steps):
            raise ValueError(
                f"CosineAnnealingWarmup: need 0 <= warmup_steps <= total_steps and total_steps > 0, "
                f"got warmup_steps={warmup_steps}, total_steps={total_steps}"
            )
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.min_lr = float(min_lr)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        if step < self.warmup_steps:
            return base_lr * (step + 1) / self.warmup_steps
        decay_steps = self.total_steps - self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / decay_steps) if decay_steps > 0 else 1.0
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


CosineWithWarmup = CosineAnnealingWarmup  # the name used in the project's issue


class LambdaLR(LRScheduler):
    """``base * lr_lambda(step)``; the lambda is not saved by ``state_dict()``."""

    def __init__(self, optimizer: Optimizer, lr_lambda, last_epoch: int = -1):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.lr_lambda(step)
