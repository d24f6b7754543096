"""L-BFGS (Liu & Nocedal 1989) as torch.optim.LBFGS runs it (after minFunc): a limited history of
``(y, s)`` pairs, the two-loop recursion for the quasi-Newton direction, and either fixed steps of
``lr`` or torch's strong-Wolfe line search with cubic interpolation (``line_search_fn="strong_wolfe"``).

One ``step(closure)`` runs up to ``max_iter`` iterations and ``max_eval`` evaluations of ``closure``
(which clears the gradients, computes the loss, calls ``backward()`` and returns the loss). All the
parameters form one flat vector: one parameter group only, every parameter on one device.

The state lives on the first parameter, under torch's keys: ``func_evals``, ``n_iter``, ``d``, ``t``,
``old_dirs``, ``old_stps``, ``ro``, ``H_diag``, ``prev_flat_grad``, ``prev_loss`` (and ``al``), so a
later ``step`` continues the same history and ``state_dict()`` / ``load_state_dict()`` carry it.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.optim.lbfgs import LBFGS
    >>> x = nn.Parameter(np.array([3.0, -2.0]))
    >>> opt = LBFGS([x], line_search_fn="strong_wolfe")
    >>> def closure():
    ...     opt.zero_grad()
    ...     loss = ((x - 1.0) ** 2).sum()
    ...     loss.backward()
    ...     return loss
    >>> _ = opt.step(closure)
    >>> np.round(x.data, 6).tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.autograd import enable_grad
from neural_arch.optim.optimizer import Optimizer, _host_copy

__all__ = ["LBFGS"]

#: state entries that are one flat vector over all the parameters (not shaped like the first one)
_FLAT = ("d", "prev_flat_grad")
#: state entries that are lists of such vectors
_FLAT_LISTS = ("old_dirs", "old_stps")


def _cubic_minimum(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimiser of the cubic through ``(x1, f1)``, ``(x2, f2)`` with slopes ``g1``, ``g2``,
    clamped to ``bounds`` (default: the interval between the points); the interval's midpoint when
    the cubic has no real minimiser (torch's ``_cubic_interpolate``, after minFunc's polyinterp)."""
    lo, hi = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    # the slopes are NumPy scalars: a zero denominator (a linear stretch) gives inf, clamped to the
    # bounds below, as torch's 0-d tensors do -- quietly, as there
    with np.errstate(divide="ignore", invalid="ignore"):
        d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
        d2_square = d1 ** 2 - g1 * g2
        if d2_square >= 0:
            d2 = d2_square ** 0.5
            if x1 <= x2:
                at = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
            else:
                at = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
            return min(max(at, lo), hi)
    return (lo + hi) / 2.0


def _strong_wolfe(evaluate, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """torch's strong-Wolfe line search along ``d`` from step ``t``: bracket a point that satisfies
    the strong Wolfe conditions (sufficient decrease ``c1``, curvature ``c2``), then zoom into the
    bracket by cubic interpolation. ``evaluate(t)`` returns ``(loss, flat_grad)`` at ``x + t * d``.
    Returns ``(loss, flat_grad, t, evaluations)`` of the point chosen.

    ``tolerance_change`` is this search's own (torch passes the default, not the optimizer's).
    """
    d_norm = abs(d).max()
    f_new, g_new = evaluate(t)
    evals = 1
    gtd_new = g_new.dot(d)

    # phase 1: grow t until [t_prev, t] brackets an acceptable point, or t itself is one
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    bracket_gtd = None
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new], [gtd_prev, gtd_new]
            break
        # extrapolate: the cubic's minimum, between a little past t and ten times t
        previous = t
        t = _cubic_minimum(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(t + 0.01 * (t - t_prev), t * 10))
        t_prev, f_prev, g_prev, gtd_prev = previous, f_new, g_new, gtd_new
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = g_new.dot(d)
        ls_iter += 1
    if ls_iter == max_ls:  # no bracket found: fall back to [0, t]
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]

    # phase 2 (zoom): shrink the bracket around a point that satisfies the conditions
    insufficient = False
    low, high = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_minimum(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        # a trial too near an end of the bracket makes little progress: twice in a row (or at the end
        # itself), move it a tenth of the bracket inside
        top, bottom = max(bracket), min(bracket)
        margin = 0.1 * (top - bottom)
        if min(top - t, t - bottom) < margin:
            if insufficient or t >= top or t <= bottom:
                t = top - margin if abs(t - top) < abs(t - bottom) else bottom + margin
                insufficient = False
            else:
                insufficient = True
        else:
            insufficient = False
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = g_new.dot(d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low]:
            # not a sufficient decrease, or no better than the low end: the trial becomes the high end
            bracket[high], bracket_f[high], bracket_g[high], bracket_gtd[high] = t, f_new, g_new, gtd_new
            low, high = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high] - bracket[low]) >= 0:
                # the slope points away from the high end: the old low end becomes the high end
                bracket[high], bracket_f[high], bracket_g[high], bracket_gtd[high] = (
                    bracket[low], bracket_f[low], bracket_g[low], bracket_gtd[low])
            bracket[low], bracket_f[low], bracket_g[low], bracket_gtd[low] = t, f_new, g_new, gtd_new
    return bracket_f[low], bracket_g[low], bracket[low], evals


class LBFGS(Optimizer):
    """L-BFGS over all the parameters as one vector; ``step(closure)`` runs a whole inner optimisation.

    Args:
        params: an iterable of Parameters (one group: per-parameter options are an error, as in torch).
        lr: the step length (scales the line search's first trial; default ``1``).
        max_iter: iterations per ``step`` (default ``20``).
        max_eval: closure evaluations per ``step`` (default ``max_iter * 5 // 4``).
        tolerance_grad: stop when the largest gradient element is at most this (default ``1e-7``).
        tolerance_change: stop when the loss or the step changes less than this (default ``1e-9``).
        history_size: how many ``(y, s)`` pairs the inverse-Hessian estimate keeps (default ``100``).
        line_search_fn: ``None`` (fixed steps) or ``"strong_wolfe"``.

    Memory: ``2 * history_size + 2`` vectors of the parameters' total size.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.optim.lbfgs import LBFGS
        >>> model = nn.Linear(2, 1)
        >>> x, y = na.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]]), na.tensor([[1.0], [2.0], [4.0]])
        >>> opt = LBFGS(model.parameters(), max_iter=50, line_search_fn="strong_wolfe")
        >>> def closure():
        ...     opt.zero_grad()
        ...     loss = ((model(x) - y) ** 2).mean()
        ...     loss.backward()
        ...     return loss
        >>> first = opt.step(closure)
        >>> float(closure()) < 1e-6 < float(first)
        True
    """

    def __init__(self, params, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None):
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        super().__init__(params, {"lr": lr, "max_iter": max_iter, "max_eval": max_eval,
                                  "tolerance_grad": tolerance_grad, "tolerance_change": tolerance_change,
                                  "history_size": history_size, "line_search_fn": line_search_fn})
        self._params = self.param_groups[0]["params"]

    def add_param_group(self, group) -> None:
        """Only the first group is accepted: L-BFGS treats all the parameters as one vector.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.optim.lbfgs import LBFGS
            >>> opt = LBFGS([nn.Parameter(np.zeros(2))])
            >>> opt.add_param_group({"params": [nn.Parameter(np.zeros(1))]})
            Traceback (most recent call last):
            ...
            ValueError: LBFGS doesn't support per-parameter options (parameter groups); pass all the parameters in one list
        """
        if self.param_groups:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups); pass all the "
                             "parameters in one list")
        super().add_param_group(group)

    # ------------------------------------------------------------------ the flat view of the parameters
    def _numel(self) -> int:
        return sum(p.data.size for p in self._params)

    def _gather_flat_grad(self):
        """The gradients as one new vector (zeros for a parameter without one)."""
        xp = _backend.get_array_module(self._params[0].data)
        parts = [xp.zeros(p.data.size, p.data.dtype) if p.grad is None else p.grad.data.reshape(-1)
                 for p in self._params]
        return xp.concatenate(parts)

    def _add_grad(self, step_size, update) -> None:
        """``p += step_size * update`` for each parameter's slice of ``update``, in place."""
        offset = 0
        for p in self._params:
            n = p.data.size
            p.data[...] += step_size * update[offset:offset + n].reshape(p.data.shape)
            offset += n

    def _directional_evaluate(self, closure, x, t, d):
        """Loss and flat gradient at ``x + t * d``; the parameters are put back to ``x`` after."""
        self._add_grad(t, d)
        with enable_grad():
            loss = float(closure())
        flat_grad = self._gather_flat_grad()
        for p, saved in zip(self._params, x):
            p.data[...] = saved
        return loss, flat_grad

    def step(self, closure=None):
        """Run up to ``max_iter`` L-BFGS iterations; returns the loss of the first ``closure()`` call.

        ``closure`` is required: it must clear the gradients, compute the loss, call ``backward()`` and
        return the loss (it runs with gradients enabled, even inside ``no_grad``).

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.optim.lbfgs import LBFGS
            >>> x = nn.Parameter(np.array([2.0]))
            >>> opt = LBFGS([x], max_iter=5)
            >>> def closure():
            ...     opt.zero_grad()
            ...     loss = (x ** 2).sum()
            ...     loss.backward()
            ...     return loss
            >>> float(opt.step(closure)), abs(float(x.data[0])) < 1e-6
            (4.0, True)
        """
        if closure is None:
            raise TypeError("LBFGS.step() needs a closure: pass a function that clears the gradients, computes "
                            "the loss, calls loss.backward() and returns the loss, as in opt.step(closure)")
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]

        # torch keeps L-BFGS's global state on the first parameter (load_state_dict then finds it)
        state = self.state.setdefault(self._params[0], {})
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        with enable_grad():
            orig_loss = closure()
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if abs(flat_grad).max() <= tolerance_grad:  # already optimal
            return orig_loss

        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        H_diag, prev_flat_grad, prev_loss = state.get("H_diag"), state.get("prev_flat_grad"), state.get("prev_loss")

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1

            # ---- the descent direction
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro = [], [], []
                H_diag = 1
            else:
                y = flat_grad - prev_flat_grad
                s = d * t
                ys = y.dot(s)
                if ys > 1e-10:  # keep the pair only when the curvature is positive
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / y.dot(y)  # the initial inverse Hessian's scale
                # two-loop recursion: d = -H g with H the L-BFGS inverse-Hessian estimate
                num_old = len(old_dirs)
                if "al" not in state:
                    state["al"] = [None] * history_size
                al = state["al"]
                q = -flat_grad
                for i in range(num_old - 1, -1, -1):
                    al[i] = old_stps[i].dot(q) * ro[i]
                    q -= al[i] * old_dirs[i]
                d = r = q * H_diag
                for i in range(num_old):
                    be_i = old_dirs[i].dot(r) * ro[i]
                    r += (al[i] - be_i) * old_stps[i]

            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.copy()
            else:
                prev_flat_grad[...] = flat_grad
            prev_loss = loss

            # ---- the step length: the first iteration ever scales it by the gradient's 1-norm
            t = min(1.0, 1.0 / abs(flat_grad).sum()) * lr if state["n_iter"] == 1 else lr
            gtd = flat_grad.dot(d)
            if gtd > -tolerance_change:  # not a descent direction (any more)
                break

            ls_func_evals = 0
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                x_init = [p.data.copy() for p in self._params]
                loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                    lambda step, x=x_init, d=d: self._directional_evaluate(closure, x, step, d),
                    t, d, loss, flat_grad, gtd)
                self._add_grad(t, d)
                opt_cond = abs(flat_grad).max() <= tolerance_grad
            else:
                self._add_grad(t, d)
                if n_iter != max_iter:
                    # re-evaluate except after the last iteration (torch: with a stochastic closure a
                    # last evaluation would be spent on a loss nobody reads)
                    with enable_grad():
                        loss = float(closure())
                    flat_grad = self._gather_flat_grad()
                    opt_cond = abs(flat_grad).max() <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            # ---- stopping conditions
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if abs(d * t).max() <= tolerance_change:  # the step no longer moves the parameters
                break
            if abs(loss - prev_loss) < tolerance_change:
                break

        state.update({"d": d, "t": t, "old_dirs": old_dirs, "old_stps": old_stps, "ro": ro, "H_diag": H_diag,
                      "prev_flat_grad": prev_flat_grad, "prev_loss": prev_loss})
        return orig_loss

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self):
        """torch's layout (the history on the first parameter), every array a host (NumPy) copy.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.optim.lbfgs import LBFGS
            >>> x = nn.Parameter(np.array([2.0, 1.0]))
            >>> opt = LBFGS([x], max_iter=3)
            >>> def closure():
            ...     opt.zero_grad(); loss = (x ** 2).sum(); loss.backward(); return loss
            >>> _ = opt.step(closure)
            >>> sorted(opt.state_dict()["state"][0])[:4]
            ['H_diag', 'al', 'd', 'func_evals']
        """
        out = super().state_dict()
        for values in out["state"].values():
            for key in _FLAT_LISTS + ("ro", "al"):
                if isinstance(values.get(key), list):
                    values[key] = [None if v is None else _host_copy(v) for v in values[key]]
        return out

    def load_state_dict(self, state_dict) -> None:
        """Restore the history saved by ``state_dict()`` (or torch's, converted to arrays).

        The flat vectors must have the parameters' total size: a history made for another model
        raises ``ValueError`` before anything changes.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.optim.lbfgs import LBFGS
            >>> x = nn.Parameter(np.array([2.0, 1.0]))
            >>> opt = LBFGS([x], max_iter=3)
            >>> def closure():
            ...     opt.zero_grad(); loss = (x ** 2).sum(); loss.backward(); return loss
            >>> _ = opt.step(closure)
            >>> again = LBFGS([nn.Parameter(x.data.copy())], max_iter=3)
            >>> again.load_state_dict(opt.state_dict())
            >>> again.state_dict()["state"][0]["n_iter"] == opt.state[x]["n_iter"]
            True
        """
        numel = self._numel()
        flat = {}
        state = {}
        for key, values in state_dict["state"].items():
            values = dict(values)
            for name in _FLAT + _FLAT_LISTS:
                if values.get(name) is None:
                    continue
                if int(key) != 0:  # torch keeps the whole history on the first parameter
                    raise ValueError(f"load_state_dict: LBFGS state {name!r} belongs to parameter {key}; it "
                                     "must be on parameter 0")
                vectors = values.pop(name)
                for v in (vectors if name in _FLAT_LISTS else [vectors]):
                    if getattr(v, "ndim", None) != 1 or v.size != numel:
                        raise ValueError(
                            f"load_state_dict: LBFGS state {name!r} holds a vector of shape "
                            f"{tuple(getattr(v, 'shape', ()))}, but the parameters have {numel} elements in all; "
                            "the state dict was saved for another model")
                flat[name] = vectors
            state[key] = values
        super().load_state_dict({**state_dict, "state": state})
        first = self.state[self._params[0]] if flat else None
        device = self._params[0].device

        def restore(v):
            return _backend.to_device(_host_copy(v), device)

        for name, vectors in flat.items():
            first[name] = [restore(v) for v in vectors] if name in _FLAT_LISTS else restore(vectors)
