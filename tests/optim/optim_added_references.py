"""Float64 NumPy references for Adamax, Adadelta, Rprop, ASGD and L-BFGS, transcribed from torch's
documented algorithms (the pseudo-code of the docs; for L-BFGS torch's ``lbfgs.py``, the only
specification of its line search), one tensor (or one flat vector) at a time.

``gs`` lists the gradient of each step, ``None`` where the parameter had none (torch skips it: its
state does not move and its step count does not advance).

Example::

    want = ref_adamax(p0, [g1, None, g2], lr=0.01, weight_decay=0.1)
"""

from __future__ import annotations

import numpy as np


def _steps(gs):
    t = 0
    for g in gs:
        if g is not None:
            t += 1
            yield t, g.astype(np.float64)


def ref_adamax(p, gs, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False):
    b1, b2 = betas
    m, u = np.zeros_like(p), np.zeros_like(p)
    for t, g in _steps(gs):
        g = (-g if maximize else g) + weight_decay * p
        m = b1 * m + (1 - b1) * g
        u = np.maximum(b2 * u, np.abs(g) + eps)
        p = p - lr * m / ((1 - b1**t) * u)
    return p


def ref_adadelta(p, gs, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False):
    v, u = np.zeros_like(p), np.zeros_like(p)
    for _, g in _steps(gs):
        g = (-g if maximize else g) + weight_decay * p
        v = rho * v + (1 - rho) * g * g
        delta = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta * delta
        p = p - lr * delta
    return p


def ref_rprop(p, gs, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), maximize=False):
    """The docs' pseudo-code, element by element (torch's code clamps every step size to
    ``step_sizes`` on every step, whichever way it moved)."""
    etaminus, etaplus = etas
    lo, hi = step_sizes
    shape = np.shape(p)
    p = np.array(p, dtype=np.float64).reshape(-1)
    eta = np.full_like(p, lr)
    prev = np.zeros_like(p)
    for _, g in _steps(gs):
        g = (-g if maximize else g).reshape(-1).copy()
        for i in range(p.size):
            if prev[i] * g[i] > 0:
                factor = etaplus
            elif prev[i] * g[i] < 0:
                factor = etaminus
                g[i] = 0.0
            else:
                factor = 1.0
            eta[i] = min(max(eta[i] * factor, lo), hi)
            p[i] -= eta[i] * np.sign(g[i])
        prev = g
    return p.reshape(shape)


def ref_asgd(p, gs, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0, maximize=False, lrs=None):
    """``lrs``: the group's ``lr`` at each step (a schedule); ``eta`` is the value the previous step left."""
    eta, mu, ax = lr if lrs is None else lrs[0], 1.0, np.zeros_like(p)
    for k, (t, g) in enumerate(_steps(gs)):
        rate = lr if lrs is None else lrs[k]
        g = (-g if maximize else g) + weight_decay * p
        p = p * (1 - lambd * eta) - eta * g
        ax = p.copy() if mu == 1 else ax + mu * (p - ax)
        eta = rate / (1 + lambd * rate * t) ** alpha
        mu = 1 / max(1, t - t0)
    return p, ax


# ---------------------------------------------------------------------------------------------- L-BFGS

def _cubic(x1, f1, g1, x2, f2, g2, lo=None, hi=None):
    """Minimiser of the interpolating cubic (minFunc's polyinterp, two points), clamped to [lo, hi]."""
    if lo is None:
        lo, hi = min(x1, x2), max(x1, x2)
    with np.errstate(divide="ignore", invalid="ignore"):  # a linear stretch: inf, clamped (torch: quietly)
        d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
        disc = d1 * d1 - g1 * g2
        if disc < 0:
            return (lo + hi) / 2.0
        d2 = np.sqrt(disc)
        if x1 <= x2:
            x = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            x = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(x, lo), hi)


def _wolfe(fg, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tol=1e-9, max_ls=25):
    dmax = np.abs(d).max()
    fn, gn = fg(x + t * d)
    n_evals, gtdn = 1, gn @ d
    tp, fp, gp, gtdp = 0, f, g, gtd
    found = False
    it = 0
    br = brf = brg = brd = None
    while it < max_ls:
        if fn > f + c1 * t * gtd or (it > 1 and fn >= fp):
            br, brf, brg, brd = [tp, t], [fp, fn], [gp, gn], [gtdp, gtdn]
            break
        if abs(gtdn) <= -c2 * gtd:
            br, brf, brg, found = [t], [fn], [gn], True
            break
        if gtdn >= 0:
            br, brf, brg, brd = [tp, t], [fp, fn], [gp, gn], [gtdp, gtdn]
            break
        t_new = _cubic(tp, fp, gtdp, t, fn, gtdn, t + 0.01 * (t - tp), 10 * t)
        tp, fp, gp, gtdp = t, fn, gn, gtdn
        t = t_new
        fn, gn = fg(x + t * d)
        n_evals += 1
        gtdn = gn @ d
        it += 1
    if it == max_ls:
        br, brf, brg = [0, t], [f, fn], [g, gn]
    stuck = False
    lo_i = 0 if brf[0] <= brf[-1] else 1
    hi_i = 1 - lo_i
    while not found and it < max_ls:
        if abs(br[1] - br[0]) * dmax < tol:
            break
        t = _cubic(br[0], brf[0], brd[0], br[1], brf[1], brd[1])
        a, b = min(br), max(br)
        room = 0.1 * (b - a)
        if min(b - t, t - a) < room:
            if stuck or t >= b or t <= a:
                t = b - room if abs(t - b) < abs(t - a) else a + room
                stuck = False
            else:
                stuck = True
        else:
            stuck = False
        fn, gn = fg(x + t * d)
        n_evals += 1
        gtdn = gn @ d
        it += 1
        if fn > f + c1 * t * gtd or fn >= brf[lo_i]:
            br[hi_i], brf[hi_i], brg[hi_i], brd[hi_i] = t, fn, gn, gtdn
            lo_i = 0 if brf[0] <= brf[1] else 1
            hi_i = 1 - lo_i
        else:
            if abs(gtdn) <= -c2 * gtd:
                found = True
            elif gtdn * (br[hi_i] - br[lo_i]) >= 0:
                br[hi_i], brf[hi_i], brg[hi_i], brd[hi_i] = br[lo_i], brf[lo_i], brg[lo_i], brd[lo_i]
            br[lo_i], brf[lo_i], brg[lo_i], brd[lo_i] = t, fn, gn, gtdn
    return brf[lo_i], brg[lo_i], br[lo_i], n_evals


class LBFGSRef:
    """torch.optim.LBFGS on a flat float64 vector; ``fg(x)`` returns ``(loss, gradient)``.
    ``step()`` is one ``optimizer.step(closure)``; the history persists between calls."""

    def __init__(self, x0, fg, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7, tolerance_change=1e-9,
                 history_size=100, line_search_fn=None):
        self.x = np.asarray(x0, dtype=np.float64).copy()
        self.fg = fg
        self.lr, self.max_iter = lr, max_iter
        self.max_eval = max_iter * 5 // 4 if max_eval is None else max_eval
        self.tol_grad, self.tol_change, self.m, self.ls = tolerance_grad, tolerance_change, history_size, line_search_fn
        self.total_iters = 0
        self.func_evals = 0
        self.d = self.t = self.prev_g = self.prev_f = None
        self.S, self.Y, self.rho, self.h = [], [], [], 1

    def step(self):
        f0, g = self.fg(self.x)
        f = f0
        evals = 1
        self.func_evals += 1
        if np.abs(g).max() <= self.tol_grad:
            return f0
        for k in range(1, self.max_iter + 1):
            self.total_iters += 1
            if self.total_iters == 1:
                self.d = -g
                self.S, self.Y, self.rho, self.h = [], [], [], 1
            else:
                y, s = g - self.prev_g, self.d * self.t
                ys = y @ s
                if ys > 1e-10:
                    if len(self.Y) == self.m:
                        del self.Y[0], self.S[0], self.rho[0]
                    self.Y.append(y)
                    self.S.append(s)
                    self.rho.append(1.0 / ys)
                    self.h = ys / (y @ y)
                q = -g
                alphas = [0.0] * len(self.Y)
                for i in reversed(range(len(self.Y))):
                    alphas[i] = (self.S[i] @ q) * self.rho[i]
                    q = q - alphas[i] * self.Y[i]
                r = q * self.h
                for i in range(len(self.Y)):
                    beta = (self.Y[i] @ r) * self.rho[i]
                    r = r + (alphas[i] - beta) * self.S[i]
                self.d = r
            self.prev_g = g.copy()
            self.prev_f = f
            self.t = min(1.0, 1.0 / np.abs(g).sum()) * self.lr if self.total_iters == 1 else self.lr
            gtd = g @ self.d
            if gtd > -self.tol_change:
                break
            used = 0
            if self.ls == "strong_wolfe":
                f, g, self.t, used = _wolfe(self.fg, self.x, self.t, self.d, f, g, gtd)
                self.x = self.x + self.t * self.d
                optimal = np.abs(g).max() <= self.tol_grad
            else:
                self.x = self.x + self.t * self.d
                optimal = False
                if k != self.max_iter:
                    f, g = self.fg(self.x)
                    optimal = np.abs(g).max() <= self.tol_grad
                    used = 1
            evals += used
            self.func_evals += used
            if k == self.max_iter or evals >= self.max_eval or optimal:
                break
            if np.abs(self.d * self.t).max() <= self.tol_change or abs(f - self.prev_f) < self.tol_change:
                break
        return f0
