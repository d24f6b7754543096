"""Float64 NumPy references for torch's recurrent layers (tests/nn/test_rnn.py), written from the equations
in torch's documentation (``nn.RNN``, ``nn.LSTM``, ``nn.GRU`` and the cells), never from our implementation:
plain loops over layers, directions and time steps, one sample at a time. Plus a central finite-difference
gradient of any such reference.

Parameters are a dict keyed by torch's names (``weight_ih_l0``, ``bias_hh_l1_reverse``, ``weight_hr_l0``...).

Example::

    >>> import numpy as np
    >>> p = {"weight_ih_l0": np.ones((1, 1)), "weight_hh_l0": np.zeros((1, 1))}
    >>> out, h_n = ref_rnn("RNN_TANH", np.ones((2, 1)), None, p, num_layers=1, hidden_size=1)
    >>> np.round(out, 4).tolist(), np.round(h_n, 4).tolist()
    ([[0.7616], [0.7616]], [[0.7616]])
"""

from __future__ import annotations

import numpy as np


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def ref_cell(mode, x, h, c, w_ih, w_hh, b_ih=None, b_hh=None, w_hr=None):
    """One step for one sample (1-D ``x``, ``h``, ``c``): torch's documented cell equations."""
    b_ih = np.zeros(w_ih.shape[0]) if b_ih is None else b_ih
    b_hh = np.zeros(w_hh.shape[0]) if b_hh is None else b_hh
    if mode in ("RNN_TANH", "RNN_RELU"):
        pre = w_ih @ x + b_ih + w_hh @ h + b_hh
        return (np.tanh(pre) if mode == "RNN_TANH" else np.maximum(pre, 0.0)), None
    if mode == "LSTM":
        n = c.shape[0]
        W_ii, W_if, W_ig, W_io = (w_ih[k * n:(k + 1) * n] for k in range(4))
        W_hi, W_hf, W_hg, W_ho = (w_hh[k * n:(k + 1) * n] for k in range(4))
        b_ii, b_if, b_ig, b_io = (b_ih[k * n:(k + 1) * n] for k in range(4))
        b_hi, b_hf, b_hg, b_ho = (b_hh[k * n:(k + 1) * n] for k in range(4))
        i = sigmoid(W_ii @ x + b_ii + W_hi @ h + b_hi)
        f = sigmoid(W_if @ x + b_if + W_hf @ h + b_hf)
        g = np.tanh(W_ig @ x + b_ig + W_hg @ h + b_hg)
        o = sigmoid(W_io @ x + b_io + W_ho @ h + b_ho)
        c_new = f * c + i * g
        h_new = o * np.tanh(c_new)
        if w_hr is not None:
            h_new = w_hr @ h_new
        return h_new, c_new
    if mode == "GRU":
        n = h.shape[0]
        W_ir, W_iz, W_in = (w_ih[k * n:(k + 1) * n] for k in range(3))
        W_hr, W_hz, W_hn = (w_hh[k * n:(k + 1) * n] for k in range(3))
        b_ir, b_iz, b_in = (b_ih[k * n:(k + 1) * n] for k in range(3))
        b_hr, b_hz, b_hn = (b_hh[k * n:(k + 1) * n] for k in range(3))
        r = sigmoid(W_ir @ x + b_ir + W_hr @ h + b_hr)
        z = sigmoid(W_iz @ x + b_iz + W_hz @ h + b_hz)
        n_ = np.tanh(W_in @ x + b_in + r * (W_hn @ h + b_hn))
        return (1 - z) * n_ + z * h, None
    raise ValueError(mode)


def ref_rnn(mode, x, hx, params, *, num_layers, hidden_size, bidirectional=False, batch_first=False,
            proj_size=0, dropout_masks=None):
    """The multi-layer, optionally bidirectional recurrence of torch's docs.

    ``x``: ``(L, N, H_in)`` (``(N, L, H_in)`` with ``batch_first``; ``(L, H_in)`` unbatched). ``hx``: None
    (zeros), ``h_0`` or, for LSTM, ``(h_0, c_0)``. ``dropout_masks[l]``: multiplies layer ``l``'s output before
    layer ``l + 1`` reads it (scale included). Returns ``(output, h_n)`` or ``(output, (h_n, c_n))``.
    """
    lstm = mode == "LSTM"
    D = 2 if bidirectional else 1
    h_out = proj_size or hidden_size
    unbatched = x.ndim == 2
    if unbatched:
        x = x[:, None]
        if hx is not None:
            hx = (hx[0][:, None], hx[1][:, None]) if lstm else hx[:, None]
    elif batch_first:
        x = x.transpose(1, 0, 2)
    L, N, _ = x.shape
    if hx is None:
        h0 = np.zeros((num_layers * D, N, h_out))
        c0 = np.zeros((num_layers * D, N, hidden_size))
    elif lstm:
        h0, c0 = hx
    else:
        h0, c0 = hx, np.zeros((num_layers * D, N, hidden_size))
    layer_in = x
    h_n = np.zeros((num_layers * D, N, h_out))
    c_n = np.zeros((num_layers * D, N, hidden_size))
    for layer in range(num_layers):
        outs = []
        for d in range(D):
            sfx = "_reverse" if d else ""
            w = [params.get(f"{stem}_l{layer}{sfx}") for stem in ("weight_ih", "weight_hh", "bias_ih", "bias_hh",
                                                                    "weight_hr")]
            k = layer * D + d
            out = np.zeros((L, N, h_out))
            for b in range(N):
                h, c = h0[k, b], c0[k, b]
                for t in (reversed(range(L)) if d else range(L)):
                    h, c = ref_cell(mode, layer_in[t, b], h, c, *w)
                    out[t, b] = h
                h_n[k, b] = h
                if lstm:
                    c_n[k, b] = c
            outs.append(out)
        layer_in = np.concatenate(outs, axis=-1)
        if dropout_masks is not None and layer < num_layers - 1:
            layer_in = layer_in * dropout_masks[layer]
    out = layer_in
    if unbatched:
        out, h_n, c_n = out[:, 0], h_n[:, 0], c_n[:, 0]
    elif batch_first:
        out = out.transpose(1, 0, 2)
    return (out, (h_n, c_n)) if lstm else (out, h_n)


def central_differences(f, arrays, upstream, eps=1e-6):
    """d sum(f(*arrays) * upstream) / d arrays[i] for every i, by central differences (float64)."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        flat, gflat = a.reshape(-1), g.reshape(-1)
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + eps
            up = float((f(*arrays) * upstream).sum())
            flat[k] = old - eps
            down = float((f(*arrays) * upstream).sum())
            flat[k] = old
            gflat[k] = (up - down) / (2 * eps)
        grads.append(g)
    return grads
