"""Learning-rate schedules: torch's (``StepLR``, ``OneCycleLR``, ``CyclicLR``, ...) and ``CosineAnnealingWarmup``
(linear warm-up, cosine decay).

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
from bisect import bisect_right
from collections import Counter

from neural_arch.optim.optimizer import Optimizer

__all__ = ["ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CosineAnnealingWarmup",
           "CosineWithWarmup", "CyclicLR", "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR", "MultiStepLR",
           "MultiplicativeLR", "OneCycleLR", "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR"]


class LRScheduler:
    """Base class: subclasses implement ``lr_at(base_lr, step)``; ``last_epoch`` counts ``step()`` calls.

    Like torch, construction performs step 0 (sets ``group["lr"]`` to the schedule's first value)
    and records each group's starting rate as ``group["initial_lr"]``.

    Example::

        >>> from neural_arch import nn, optim
        >>> class Halving(optim.lr_scheduler.LRScheduler):
        ...     def lr_at(self, base_lr, step):
        ...         return base_lr / 2 ** step
        >>> opt = optim.SGD(nn.Linear(2, 1).parameters(), lr=1.0)
        >>> sched = Halving(opt)
        >>> opt.step(); sched.step()
        >>> sched.get_last_lr()
        [0.5]
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
        self._initial_step()

    def lr_at(self, base_lr: float, step: int) -> float:
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    #: True only during the step taken at construction (or by ``SequentialLR`` starting a schedule).
    #: As in torch 2.13, the recursive schedules (exponential, linear, polynomial, multiplicative) leave
    #: the rate in force alone then, so one built with ``last_epoch=k`` over a loaded optimizer goes on
    #: from the loaded rate; ``MultiplicativeLR`` restarted by ``SequentialLR`` with ``step(0)`` does scale
    _is_initial = False

    def _initial_step(self) -> None:
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def step(self, epoch: int | None = None) -> None:
        """Advance one step and write the new rates into the optimizer.

        ``step(epoch)`` jumps to ``epoch`` (torch's deprecated form, used by ``SequentialLR``):
        schedules with a recursive rule then use their closed form.
        """
        if epoch is None:
            self.last_epoch += 1
            self._last_lr = self.get_lr()
        else:
            self.last_epoch = int(epoch)
            closed = getattr(self, "_get_closed_form_lr", None)
            self._last_lr = closed() if closed is not None else self.get_lr()
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
    """Multiply the rate by ``gamma`` every ``step_size`` steps: ``base * gamma ** (step // step_size)``.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 1).parameters(), lr=1.0)
        >>> sched = optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
        >>> rates = []
        >>> for _ in range(5):
        ...     rates.append(round(sched.get_last_lr()[0], 3)); opt.step(); sched.step()
        >>> rates
        [1.0, 1.0, 0.1, 0.1, 0.01]
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if int(step_size) <= 0:
            raise ValueError(f"StepLR: step_size must be a positive integer, got {step_size}")
        self.step_size = int(step_size)
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.gamma ** (step // self.step_size)

    def get_lr(self) -> list[float]:
        # Chainable, as torch's: scale the rate in force, so ``ChainedScheduler`` keeps the other
        # schedules' factors (a closed form here would overwrite them with ``base * gamma**k``).
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [g["lr"] for g in groups]
        return [g["lr"] * self.gamma for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]


class CosineAnnealingWarmup(LRScheduler):
    """Linear warm-up to the base rate, then half a cosine down to ``min_lr`` at ``total_steps``.

    For step s (0-based count of ``step()`` calls): during warm-up ``base * (s + 1) / warmup_steps``
    (so the very first update already moves), then
    ``min_lr + (base - min_lr) * (1 + cos(pi * p)) / 2`` with ``p = (s - warmup) / (total - warmup)``,
    held at ``min_lr`` after ``total_steps``.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 1).parameters(), lr=1.0)
        >>> sched = optim.lr_scheduler.CosineWithWarmup(opt, warmup_steps=2, total_steps=6)
        >>> rates = []
        >>> for _ in range(6):
        ...     rates.append(round(sched.get_last_lr()[0], 3)); opt.step(); sched.step()
        >>> rates
        [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
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
    """``base * lr_lambda(step)``; ``lr_lambda`` is one function, or a list with one per param group
    (torch's form). The functions are not saved by ``state_dict()``.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 1).parameters(), lr=1.0)
        >>> sched = optim.lr_scheduler.LambdaLR(opt, lr_lambda=lambda step: 0.5 ** step)
        >>> rates = []
        >>> for _ in range(3):
        ...     rates.append(round(sched.get_last_lr()[0], 3)); opt.step(); sched.step()
        >>> rates
        [1.0, 0.5, 0.25]
    """

    def __init__(self, optimizer: Optimizer, lr_lambda, last_epoch: int = -1):
        self.lr_lambdas = _lambdas_per_group(lr_lambda, optimizer, "LambdaLR")
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.lr_lambdas[0](step)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]

    def state_dict(self) -> dict:
        """As :meth:`LRScheduler.state_dict`, without the functions (code is not state; a list of
        lambdas would make the dict unpicklable)."""
        return {k: v for k, v in super().state_dict().items() if k not in ("lr_lambdas", "lr_lambda")}


# --------------------------------------------------------------------------------------------
# torch's chainable schedules. Like torch, these compute each step's rate from the rate now in
# ``group["lr"]`` (so ``ChainedScheduler`` can compose them multiplicatively) and fall back to a
# closed form when ``SequentialLR`` restarts them with ``step(0)``.


class LinearLR(LRScheduler):
    """Scale the rate linearly from ``start_factor`` to ``end_factor`` times the base over
    ``total_iters`` steps, then hold: ``base * (s + (e - s) * min(t, total_iters) / total_iters)``.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.LinearLR(opt, start_factor=0.5, total_iters=2)
        >>> [sched.get_last_lr()[0] for _ in range(3) if not sched.step()]
        [0.75, 1.0, 1.0]
    """

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        if not 0 < start_factor <= 1:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, int(total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in groups]
        if self._is_initial or self.last_epoch > self.total_iters:  # resumed with last_epoch: keep the rate
            return [g["lr"] for g in groups]
        ratio = 1.0 + (self.end_factor - self.start_factor) / (
            self.total_iters * self.start_factor + (self.last_epoch - 1) * (self.end_factor - self.start_factor))
        return [g["lr"] * ratio for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        frac = min(self.total_iters, self.last_epoch) / self.total_iters if self.total_iters else 1.0
        return [b * (self.start_factor + (self.end_factor - self.start_factor) * frac) for b in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the rate by ``gamma`` at each milestone step: ``base * gamma ** #{m <= t}``.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.MultiStepLR(opt, milestones=[1, 3], gamma=0.5)
        >>> [sched.get_last_lr()[0] for _ in range(4) if not sched.step()]
        [0.5, 0.5, 0.25, 0.25]
    """

    def __init__(self, optimizer: Optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        self.milestones = dict(Counter(int(m) for m in milestones))  # a plain dict: state_dict stays picklable anywhere
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        times = self.milestones.get(self.last_epoch, 0)
        return [g["lr"] * self.gamma ** times for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        ms = sorted(Counter(self.milestones).elements())
        return [b * self.gamma ** bisect_right(ms, self.last_epoch) for b in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the rate by ``gamma`` every step: ``base * gamma ** t``.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.ExponentialLR(opt, gamma=0.5)
        >>> sched.step(); sched.get_last_lr()
        [0.5]
    """

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self._is_initial:  # resumed with last_epoch: keep the rate (torch 2.13)
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [b * self.gamma ** self.last_epoch for b in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Half a cosine from the base rate down to ``eta_min`` over ``T_max`` steps (torch's SGDR
    schedule without restarts): ``eta_min + (base - eta_min) * (1 + cos(pi * t / T_max)) / 2``.

    Chainable like torch's: each step rescales the rate in force by the ratio of consecutive
    cosine values, so past ``T_max`` the rate climbs back up (the cosine continues).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD([nn.Parameter(np.ones(1))], lr=1.0)
        >>> sched = CosineAnnealingLR(opt, T_max=2)
        >>> rates = []
        >>> for _ in range(3):
        ...     rates.append(round(opt.param_groups[0]["lr"], 3)); opt.step(); sched.step()
        >>> rates
        [1.0, 0.5, 0.0]
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        if int(T_max) <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be a positive integer, got {T_max}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups, t, period = self.optimizer.param_groups, self.last_epoch, self.T_max
        if t == 0:
            return [g["lr"] for g in groups]
        if (t - 1 - period) % (2 * period) == 0:  # the bottom of the cosine: the ratio below would be 0/0
            return [g["lr"] + (base - self.eta_min) * (1 - math.cos(math.pi / period)) / 2
                    for base, g in zip(self.base_lrs, groups)]
        ratio = (1 + math.cos(math.pi * t / period)) / (1 + math.cos(math.pi * (t - 1) / period))
        return [ratio * (g["lr"] - self.eta_min) + self.eta_min for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class MultiplicativeLR(LRScheduler):
    """Multiply the rate in force by ``lr_lambda(step)`` at every step after the first (torch's):
    ``lr_t = lr_{t-1} * lr_lambda(t)``. ``lr_lambda`` is one function or a list, one per param group;
    the functions are not saved by ``state_dict()``.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.lr_scheduler.MultiplicativeLR(opt, lr_lambda=lambda step: 0.5)
        >>> [sched.get_last_lr()[0] for _ in range(3) if not sched.step()]
        [0.5, 0.25, 0.125]
    """

    def __init__(self, optimizer: Optimizer, lr_lambda, last_epoch: int = -1):
        self.lr_lambdas = _lambdas_per_group(lr_lambda, optimizer, "MultiplicativeLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        if self._is_initial:
            return [g["lr"] for g in groups]
        return [g["lr"] * fn(self.last_epoch) for g, fn in zip(groups, self.lr_lambdas)]

    def state_dict(self) -> dict:
        """Without the functions (code is not state)."""
        return {k: v for k, v in super().state_dict().items() if k != "lr_lambdas"}


class ConstantLR(LRScheduler):
    """Scale the rate by ``factor`` for the first ``total_iters`` steps, then restore it:
    ``base * factor`` while ``t < total_iters``, ``base`` after (torch's; chainable). With
    ``total_iters=0`` the rate is never scaled (torch's recursion would keep ``base * factor`` for ever).

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2)
        >>> rates = []
        >>> for _ in range(4):
        ...     rates.append(sched.get_last_lr()[0]); opt.step(); sched.step()
        >>> rates
        [0.5, 0.5, 1.0, 1.0]
    """

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1):
        if not 0 <= factor <= 1:
            raise ValueError(f"ConstantLR: factor must be in [0, 1], got {factor}")
        if int(total_iters) < 0:
            raise ValueError(f"ConstantLR: total_iters must be >= 0, got {total_iters}")
        self.factor, self.total_iters = float(factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            # total_iters=0: no scaled steps at all (torch scales step 0 and then never restores)
            return [g["lr"] * (self.factor if self.total_iters > 0 else 1.0) for g in groups]
        if self.last_epoch != self.total_iters:
            return [g["lr"] for g in groups]
        if self.factor == 0:  # the ratio below would divide by zero (torch raises ZeroDivisionError)
            return list(self.base_lrs)
        return [g["lr"] * (1.0 / self.factor) for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [b * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor)) for b in self.base_lrs]


class PolynomialLR(LRScheduler):
    """Decay to 0 over ``total_iters`` steps: ``base * (1 - min(t, total_iters) / total_iters) ** power``
    (torch's; chainable).

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.lr_scheduler.PolynomialLR(opt, total_iters=4, power=1.0)
        >>> [sched.get_last_lr()[0] for _ in range(5) if not sched.step()]
        [0.75, 0.5, 0.25, 0.0, 0.0]
    """

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1):
        if int(total_iters) <= 0:
            raise ValueError(f"PolynomialLR: total_iters must be a positive integer, got {total_iters}")
        self.total_iters, self.power = int(total_iters), float(power)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups, t, n = self.optimizer.param_groups, self.last_epoch, self.total_iters
        if t == 0 or t > n or self._is_initial:
            return [g["lr"] for g in groups]
        factor = ((1.0 - t / n) / (1.0 - (t - 1) / n)) ** self.power
        return [g["lr"] * factor for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        frac = min(self.total_iters, self.last_epoch) / self.total_iters
        return [b * (1.0 - frac) ** self.power for b in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR (Loshchilov & Hutter): half a cosine from the base rate to ``eta_min`` over ``T_0`` steps,
    then restart; each period is ``T_mult`` times longer than the one before.
    ``eta_min + (base - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2``.

    ``step(epoch)`` accepts a fractional epoch (``epoch + batch / batches``), as torch's does.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2)
        >>> rates = []
        >>> for _ in range(5):
        ...     rates.append(round(sched.get_last_lr()[0], 3)); opt.step(); sched.step()
        >>> rates
        [1.0, 0.5, 1.0, 0.5, 1.0]
    """

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1):
        if not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"CosineAnnealingWarmRestarts: T_0 must be a positive integer, got {T_0!r}")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"CosineAnnealingWarmRestarts: T_mult must be an integer >= 1, got {T_mult!r}")
        self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, float(eta_min)
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        cos = (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
        return [self.eta_min + (base - self.eta_min) * cos for base in self.base_lrs]

    def step(self, epoch: float | None = None) -> None:
        """Advance one step, or jump to ``epoch`` (may be fractional)."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:
                self.T_cur -= self.T_i
                self.T_i *= self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"CosineAnnealingWarmRestarts: expected a non-negative epoch, got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    # the period n that holds epoch, found exactly (a float log can land a hair below
                    # an integer at a period's first epoch and pick the period before it)
                    n, start = 0, 0
                    while epoch >= start + self.T_0 * self.T_mult**n:
                        start += self.T_0 * self.T_mult**n
                        n += 1
                    self.T_cur = epoch - start
                    self.T_i = self.T_0 * self.T_mult**n
            else:
                self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


def _lambdas_per_group(lr_lambda, optimizer, who):
    """One function per param group: torch's ``lr_lambda`` is one function or a list of them."""
    if isinstance(lr_lambda, (list, tuple)):
        if len(lr_lambda) != len(optimizer.param_groups):
            raise ValueError(f"{who}: expected {len(optimizer.param_groups)} lr_lambdas (one per param group), "
                             f"but got {len(lr_lambda)}")
        return list(lr_lambda)
    return [lr_lambda] * len(optimizer.param_groups)

def _per_group(value, optimizer, name, who):
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{who}: expected {len(optimizer.param_groups)} values for {name} (one per "
                             f"param group), got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin): warm from ``max_lr / div_factor`` up to ``max_lr`` over
    ``pct_start`` of the steps, then anneal to ``initial_lr / final_div_factor``; momentum (or
    Adam's beta1) cycles the other way between ``max_momentum`` and ``base_momentum``.

    Call ``step()`` after every batch; ``total_steps`` (or ``epochs * steps_per_epoch``) steps
    in all, and one more raises. ``three_phase=True`` anneals back to the initial rate before
    the final decay (fastai's original schedule).

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
        >>> sched = optim.OneCycleLR(opt, max_lr=1.0, total_steps=10)
        >>> round(sched.get_last_lr()[0], 3), opt.param_groups[0]["momentum"]
        (0.04, 0.95)
    """

    def __init__(self, optimizer: Optimizer, max_lr, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True, base_momentum=0.85,
                 max_momentum=0.95, div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"OneCycleLR needs an Optimizer, got {type(optimizer).__name__}")
        if total_steps is not None:
            if int(total_steps) <= 0:
                raise ValueError(f"OneCycleLR: total_steps must be a positive integer, got {total_steps}")
            self.total_steps = int(total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            if int(epochs) <= 0 or int(steps_per_epoch) <= 0:
                raise ValueError(f"OneCycleLR: epochs and steps_per_epoch must be positive integers, got "
                                 f"{epochs} and {steps_per_epoch}")
            self.total_steps = int(epochs) * int(steps_per_epoch)
        else:
            raise ValueError("OneCycleLR: pass total_steps, or both epochs and steps_per_epoch")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        self.cycle_momentum = bool(cycle_momentum)
        n = self.total_steps
        if three_phase:
            self._schedule_phases = [
                {"end_step": float(pct_start * n) - 1, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": float(2 * pct_start * n) - 2, "start_lr": "max_lr", "end_lr": "initial_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
                {"end_step": n - 1, "start_lr": "initial_lr", "end_lr": "min_lr",
                 "start_momentum": "max_momentum", "end_momentum": "max_momentum"},
            ]
        else:
            self._schedule_phases = [
                {"end_step": float(pct_start * n) - 1, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": n - 1, "start_lr": "max_lr", "end_lr": "min_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
            ]
        groups = optimizer.param_groups
        max_lrs = _per_group(max_lr, optimizer, "max_lr", "OneCycleLR")
        if last_epoch == -1:
            for group, top in zip(groups, max_lrs):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(f"OneCycleLR: cycle_momentum=True needs an optimizer with 'momentum' or "
                                 f"'betas'; {type(optimizer).__name__} has neither (pass cycle_momentum=False)")
            self.use_beta1 = "betas" in optimizer.defaults
            tops = _per_group(max_momentum, optimizer, "max_momentum", "OneCycleLR")
            bases = _per_group(base_momentum, optimizer, "base_momentum", "OneCycleLR")
            if last_epoch == -1:
                for group, top, base in zip(groups, tops, bases):
                    self._set_momentum(group, top)
                    group["max_momentum"], group["base_momentum"] = top, base
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group, value) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {step} times, but total_steps is {self.total_steps}; "
                             "build the scheduler with more steps (or stop stepping it)")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == len(self._schedule_phases) - 1:
                    if end == start:  # torch divides by zero here; say what to change instead
                        raise ValueError(
                            f"OneCycleLR: total_steps={self.total_steps} with this pct_start leaves phase {i + 1} "
                            "of the cycle with no steps; use more total_steps or another pct_start")
                    pct = (step - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        mom = self._anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                    break
                start = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                self._set_momentum(group, mom)
        return lrs


class CyclicLR(LRScheduler):
    """Cyclical learning rates (Smith 2017): the rate climbs from ``base_lr`` to ``max_lr`` over
    ``step_size_up`` steps and back over ``step_size_down`` (default: the same), with the amplitude
    scaled by ``mode``: ``'triangular'`` (constant), ``'triangular2'`` (halved every cycle) or
    ``'exp_range'`` (``gamma ** step``); or by your ``scale_fn`` of the cycle number (``scale_mode='cycle'``)
    or of the step (``'iterations'``). Momentum (or Adam's beta1) cycles the other way between
    ``max_momentum`` and ``base_momentum``. Call ``step()`` after every batch.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
        >>> sched = optim.lr_scheduler.CyclicLR(opt, base_lr=0.1, max_lr=0.5, step_size_up=2)
        >>> rates = []
        >>> for _ in range(5):
        ...     rates.append(round(sched.get_last_lr()[0], 3)); opt.step(); sched.step()
        >>> rates
        [0.1, 0.3, 0.5, 0.3, 0.1]
    """

    def __init__(self, optimizer: Optimizer, base_lr, max_lr, step_size_up: int = 2000, step_size_down=None,
                 mode: str = "triangular", gamma: float = 1.0, scale_fn=None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum=0.8, max_momentum=0.9, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"CyclicLR needs an Optimizer, got {type(optimizer).__name__}")
        if scale_fn is None and mode not in ("triangular", "triangular2", "exp_range"):
            raise ValueError(f"CyclicLR: mode must be 'triangular', 'triangular2' or 'exp_range', got {mode!r}")
        if scale_mode not in ("cycle", "iterations"):
            raise ValueError(f"CyclicLR: scale_mode must be 'cycle' or 'iterations', got {scale_mode!r}")
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        if not (up > 0 and down >= 0):  # NaN too; a zero-length cycle would divide by zero
            raise ValueError(f"CyclicLR: need step_size_up > 0 and step_size_down >= 0, got {step_size_up} "
                             f"and {step_size_down}")
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        self.mode, self.gamma, self.scale_mode = mode, float(gamma), scale_mode
        self.scale_fn = scale_fn  # None: the mode's rule (kept out of state_dict either way: code is not state)
        if scale_fn is None:
            self.scale_mode = "iterations" if mode == "exp_range" else "cycle"
        groups = optimizer.param_groups
        base_lrs = _per_group(base_lr, optimizer, "base_lr", "CyclicLR")
        if last_epoch == -1:
            for group, lr in zip(groups, base_lrs):
                group["lr"] = lr
        # the cycle's floor, also for the construction step (the base class sets ``base_lrs`` from
        # ``initial_lr``, which another scheduler may have set to something else)
        self._cycle_bases = list(base_lrs)
        self.max_lrs = _per_group(max_lr, optimizer, "max_lr", "CyclicLR")
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(f"CyclicLR: cycle_momentum=True needs an optimizer with 'momentum' or 'betas'; "
                                 f"{type(optimizer).__name__} has neither (pass cycle_momentum=False)")
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group(base_momentum, optimizer, "base_momentum", "CyclicLR")
            self.max_momentums = _per_group(max_momentum, optimizer, "max_momentum", "CyclicLR")
            if last_epoch == -1:
                for group, top in zip(groups, self.max_momentums):
                    self._set_momentum(group, top)
        super().__init__(optimizer, last_epoch)
        self.base_lrs = list(base_lrs)

    def _set_momentum(self, group, value) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _scale(self, x: float) -> float:
        if self.scale_fn is not None:
            return self.scale_fn(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma**x

    def get_lr(self) -> list[float]:
        t = self.last_epoch
        cycle = math.floor(1 + t / self.total_size)
        x = 1.0 + t / self.total_size - cycle
        factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self._scale(cycle if self.scale_mode == "cycle" else t)
        lrs = [base + (top - base) * factor * scale for base, top in zip(self._cycle_bases, self.max_lrs)]
        if self.cycle_momentum:
            for group, lo, hi in zip(self.optimizer.param_groups, self.base_momentums, self.max_momentums):
                self._set_momentum(group, hi - (hi - lo) * factor * scale)
        return lrs

    def state_dict(self) -> dict:
        """Without ``scale_fn`` (code is not state: pass it again when rebuilding the scheduler)."""
        return {k: v for k, v in super().state_dict().items() if k != "scale_fn"}

    def load_state_dict(self, state_dict: dict) -> None:
        fn = self.scale_fn
        super().load_state_dict(state_dict)
        self.scale_fn = fn


class ReduceLROnPlateau(LRScheduler):
    """Multiply the rate by ``factor`` once ``metrics`` passed to ``step(metrics)`` has not improved
    for more than ``patience`` steps, then wait ``cooldown`` steps; never below ``min_lr``, and
    skip changes smaller than ``eps``. ``mode='max'`` for metrics that should grow (accuracy).

    "Improved" is ``a < best * (1 - threshold)`` (``'rel'``) or ``a < best - threshold`` (``'abs'``)
    in ``min`` mode, and the mirror in ``max`` mode — torch's definitions.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.ReduceLROnPlateau(opt, patience=1, factor=0.5)
        >>> for loss in [1.0, 1.0, 1.0]:
        ...     sched.step(loss)
        >>> sched.get_last_lr()
        [0.5]
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0, min_lr=0.0,
                 eps: float = 1e-8):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"ReduceLROnPlateau needs an Optimizer, got {type(optimizer).__name__}")
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1.0, got {factor}")
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        self.optimizer = optimizer
        self.factor, self.patience, self.threshold = float(factor), int(patience), float(threshold)
        self.mode, self.threshold_mode, self.cooldown, self.eps = mode, threshold_mode, int(cooldown), float(eps)
        self.min_lrs = [float(m) for m in _per_group(min_lr, optimizer, "min_lr", "ReduceLROnPlateau")]
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.best = self.mode_worse
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def is_better(self, a: float, best: float) -> bool:
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return a > (best * (self.threshold + 1.0) if self.threshold_mode == "rel" else best + self.threshold)

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def step(self, metrics, epoch: int | None = None) -> None:
        """Record one value of the watched metric (a loss, an accuracy) and maybe reduce the rates."""
        current = float(metrics)
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad steps during cooldown do not count
        if self.num_bad_epochs > self.patience:
            for group, floor in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(group["lr"])
                new = max(old * self.factor, floor)
                if old - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def load_state_dict(self, state_dict: dict) -> None:
        # Like torch: the rates themselves live in the optimizer's state dict.
        self.__dict__.update(state_dict)


class ChainedScheduler(LRScheduler):
    """Step several chainable schedules together on one optimizer: their factors multiply.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = optim.ChainedScheduler([optim.LinearLR(opt, start_factor=0.5, total_iters=2),
        ...                                 optim.ExponentialLR(opt, gamma=0.9)])
        >>> sched.step(); [round(x, 4) for x in sched.get_last_lr()]
        [0.675]
    """

    def __init__(self, schedulers, optimizer: Optimizer | None = None):
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler: pass at least one scheduler")
        optimizer = optimizer if optimizer is not None else schedulers[0].optimizer
        for i, s in enumerate(schedulers):
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(f"ChainedScheduler: scheduler {i} ({type(s).__name__}) steps another optimizer "
                                 "than the others; all must share one optimizer")
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def step(self) -> None:
        for s in self._schedulers:
            s.step()
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        inner = state.pop("_schedulers")
        self.__dict__.update(state)
        for s, sd in zip(self._schedulers, inner):
            s.load_state_dict(sd)
        # The inner loads each wrote their own last rates; the composite's are the ones in force.
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


class SequentialLR(LRScheduler):
    """Run ``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]`` (restarted at its step 0),
    and so on — e.g. a ``LinearLR`` warm-up followed by ``ExponentialLR`` decay.

    Example::

        >>> from neural_arch import nn, optim
        >>> opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
        >>> warm = optim.LinearLR(opt, start_factor=0.5, total_iters=2)
        >>> decay = optim.ExponentialLR(opt, gamma=0.5)
        >>> sched = optim.SequentialLR(opt, [warm, decay], milestones=[2])
        >>> [sched.get_last_lr()[0] for _ in range(4) if not sched.step()]
        [0.75, 1.0, 0.5, 0.25]
    """

    def __init__(self, optimizer: Optimizer, schedulers, milestones, last_epoch: int = -1):
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("SequentialLR: pass at least one scheduler")
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):  # torch raises ValueError here too
                raise ValueError(  # noqa: TRY004
                    f"SequentialLR: scheduler {i} is a ReduceLROnPlateau, which steps on a metric "
                    "and cannot be sequenced; step it yourself")
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(f"SequentialLR: scheduler {i} ({type(s).__name__}) steps another optimizer "
                                 "than the one given")
        milestones = [int(m) for m in milestones]
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: expected {len(schedulers) - 1} milestones for {len(schedulers)} "
                             f"schedulers, got {len(milestones)}")
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # Each scheduler's construction already took its step 0; undo them (inside composites too)
        # and restart the one that runs at step 0 -- not always the first: milestones may start at 0.
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        _undo_initial_steps(schedulers)
        first = schedulers[bisect_right(milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def step(self) -> None:
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler.step(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    state_dict = ChainedScheduler.state_dict
    load_state_dict = ChainedScheduler.load_state_dict


def _undo_initial_steps(schedulers) -> None:
    """Take back the step each scheduler took when it was built, recursing into composites
    (``SequentialLR``/``ChainedScheduler`` hold schedulers but count no steps of their own that matter)."""
    for s in schedulers:
        inner = getattr(s, "_schedulers", None)
        if inner is not None:
            _undo_initial_steps(inner)
        else:
            s.last_epoch -= 1
