"""torch's recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and the one-step ``RNNCell``, ``LSTMCell``,
``GRUCell``, with torch's arguments, parameter names (``weight_ih_l0``, ``bias_hh_l1_reverse``,
``weight_hr_l0``...), shapes, gate order and initialisation, so a ported script loads torch's
``state_dict`` unchanged.

The forward is built from differentiable ops, so autograd needs no backward of its own: per layer
and direction, the input part of every gate for the whole sequence is one GEMM
(``F.linear(x, weight_ih, bias_ih)`` over ``(L, N, H_in)``), then a loop over time adds the hidden
part (``F.linear(h, weight_hh, bias_hh)``) and applies the gates. Packed sequences
(``nn.utils.rnn.PackedSequence``) are not supported: pad the batch to ``(L, N, H_in)`` instead (an
input that is neither a Tensor nor an array is refused with that advice).

Example::

    >>> import neural_arch as na
    >>> from neural_arch.nn.rnn import LSTM
    >>> lstm = LSTM(3, 4, num_layers=2)
    >>> out, (h_n, c_n) = lstm(na.randn(5, 2, 3))       # (L, N, H_in), time first as in torch
    >>> out.shape, h_n.shape, c_n.shape
    ((5, 2, 4), (2, 2, 4), (2, 2, 4))
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from neural_arch.core import autocast_state
from neural_arch.core.ops_shape import cat, stack
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F
from neural_arch.nn import init
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNBase", "RNNCell", "RNNCellBase"]

#: rows of ``weight_ih`` / ``weight_hh`` per hidden unit: one per gate, in torch's order
_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _tensor(value, who: str) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("cupy"):
        return Tensor(value)
    raise TypeError(f"{who}: expected a Tensor (or an array), got {type(value).__name__}; packed sequences "
                    "(nn.utils.rnn.PackedSequence) are not supported here: pad the batch to one (L, N, H_in) "
                    "tensor instead")


def _autocasting() -> bool:
    # torch skips the dtype check inside an autocast region: the GEMMs run in the lower precision there
    region = autocast_state.current()
    return bool(region and region[0])


def _zeros(shape, like: Tensor) -> Tensor:
    from neural_arch.core.factory import zeros

    return zeros(shape, dtype=like.dtype, device=like.device)


def _time_steps(x: Tensor) -> list:
    """``[x[0], ..., x[L-1]]``, taken by halving: the backward of an index op fills an array of its
    input's size, so ``L`` direct ``x[t]`` would cost ``L * x.size`` in backward (quadratic in the sequence
    length); halving keeps each level of the tree at ``x.size``, ``log2(L)`` levels in all."""
    steps = x.shape[0]
    if steps <= 4:
        return [x[t] for t in range(steps)]
    mid = steps // 2
    return _time_steps(x[:mid]) + _time_steps(x[mid:])


# ----------------------------------------------------------------------------- one time step
# ``gi`` is the input part of the gates, ``x @ weight_ih.T + bias_ih``, computed for the whole
# sequence at once by the layers (one GEMM) and for one step by the cells; the step adds the hidden part.
def _rnn_step(gi, h, w_hh, b_hh, act):
    return act(gi + F.linear(h, w_hh, b_hh))


def _lstm_step(gi, h, c, w_hh, b_hh, w_hr=None):
    s = gi + F.linear(h, w_hh, b_hh)
    n = c.shape[-1]
    i = F.sigmoid(s[..., :n])                 # torch's gate order: input, forget, cell (g), output
    f = F.sigmoid(s[..., n:2 * n])
    g = F.tanh(s[..., 2 * n:3 * n])
    o = F.sigmoid(s[..., 3 * n:])
    c = f * c + i * g
    h = o * F.tanh(c)
    if w_hr is not None:                      # LSTM with projections: h_t = W_hr (o * tanh(c_t))
        h = F.linear(h, w_hr)
    return h, c


def _gru_step(gi, h, w_hh, b_hh):
    gh = F.linear(h, w_hh, b_hh)
    n_ = h.shape[-1]
    r = F.sigmoid(gi[..., :n_] + gh[..., :n_])                 # torch's order: reset, update (z), new
    z = F.sigmoid(gi[..., n_:2 * n_] + gh[..., n_:2 * n_])
    # torch's GRU applies r after W_hn h + b_hn (not before the product, as the original paper does)
    n = F.tanh(gi[..., 2 * n_:] + r * gh[..., 2 * n_:])
    return n + z * (h - n)                                    # (1 - z) * n + z * h


# ----------------------------------------------------------------------------- the layers
class RNNBase(Module):
    """What ``RNN``, ``LSTM`` and ``GRU`` share (torch's ``nn.RNNBase``): the parameters of every layer and
    direction, their initialisation, the argument checks and the multi-layer, bidirectional forward.
    ``mode`` is ``'RNN_TANH'``, ``'RNN_RELU'``, ``'LSTM'`` or ``'GRU'``; the other arguments are those of
    the subclasses. Parameters per layer ``k`` (``_reverse`` for the second direction), registered in
    torch's order so ``parameters()`` and ``state_dict()`` list them as torch does: ``weight_ih_lk``
    ``(gates * hidden_size, in)``, ``weight_hh_lk`` ``(gates * hidden_size, H_out)``, ``bias_ih_lk`` and
    ``bias_hh_lk`` ``(gates * hidden_size,)`` when ``bias``, ``weight_hr_lk`` ``(proj_size, hidden_size)``
    when ``proj_size > 0``; ``in`` is ``input_size`` for ``k = 0``, else ``num_directions * H_out``.
    All are drawn from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))`` by the seeded generator.

    Example::

        >>> from neural_arch.nn.rnn import RNNBase
        >>> [name for name, _ in RNNBase("GRU", 2, 3, bias=False).named_parameters()]
        ['weight_ih_l0', 'weight_hh_l0']
    """

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None) -> None:
        super().__init__()
        # torch's checks, in torch's order and with its exception types
        if not isinstance(dropout, numbers.Number) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an "
                             "element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and "
                          f"num_layers={num_layers}", stacklevel=3)
        if not isinstance(hidden_size, int):
            raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if mode not in _GATES:
            raise ValueError("Unrecognized RNN mode: " + str(mode))
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode = mode
        self.input_size = int(input_size)
        self.hidden_size = hidden_size
        self.num_layers = int(num_layers)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.proj_size = int(proj_size)
        dtype = np.float32 if dtype is None else dtype
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        num_directions = 2 if bidirectional else 1
        self._flat_weights_names: list[str] = []
        self._all_weights: list[list[str]] = []
        for layer in range(self.num_layers):
            for direction in range(num_directions):
                layer_input = self.input_size if layer == 0 else real_hidden * num_directions
                shapes = [("weight_ih", (gate_size, layer_input)), ("weight_hh", (gate_size, real_hidden))]
                if self.bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size > 0:
                    shapes += [("weight_hr", (proj_size, hidden_size))]
                suffix = "_reverse" if direction == 1 else ""
                names = []
                for stem, shape in shapes:
                    name = f"{stem}_l{layer}{suffix}"
                    setattr(self, name, Parameter(np.empty(shape, dtype=dtype), device=device))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every parameter from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``, in registration order.

        Example::

            >>> from neural_arch.nn.rnn import GRU
            >>> gru = GRU(2, 4)
            >>> gru.reset_parameters()
            >>> all(float(abs(p.data).max()) <= 0.5 for p in gru.parameters())
            True
        """
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """A no-op, kept so ported scripts run: torch packs the weights into one cuDNN buffer here; this
        framework has no cuDNN RNN, so there is nothing to pack.

        Example::

            >>> from neural_arch.nn.rnn import LSTM
            >>> LSTM(2, 3).flatten_parameters() is None
            True
        """

    @property
    def all_weights(self) -> list:
        """The parameters grouped per layer and direction, in torch's order (``[[w_ih, w_hh, b_ih, b_hh], ...]``).

        Example::

            >>> from neural_arch.nn.rnn import RNN
            >>> [len(group) for group in RNN(2, 3, num_layers=2, bias=False).all_weights]
            [2, 2]
        """
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    # ------------------------------------------------------------------ torch's checks
    def check_input(self, input: Tensor, batch_sizes=None) -> None:
        """torch's check of a (batched, 3-D) input: its dtype is the parameters', its last dim ``input_size``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import RNN
            >>> RNN(3, 2).check_input(na.ones(4, 1, 3)) is None
            True
        """
        if batch_sizes is not None:
            raise NotImplementedError("check_input: packed sequences (batch_sizes) are not supported; pad the "
                                      "batch to one (L, N, H_in) tensor instead")
        weight = getattr(self, self._flat_weights_names[0])
        if input.dtype != weight.dtype and not _autocasting():
            raise ValueError(f"input must have the type {weight.dtype}, got type {input.dtype} (convert it with "
                             f".to(...), or build the module with dtype={input.dtype})")
        if input.ndim != 3:
            raise RuntimeError(f"input must have 3 dimensions, got {input.ndim}")
        if self.input_size != input.shape[-1]:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.shape[-1]}")

    def get_expected_hidden_size(self, input: Tensor, batch_sizes=None) -> tuple[int, int, int]:
        """The shape ``h_0`` must have for this (3-D) input: ``(D * num_layers, N, H_out)``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import LSTM
            >>> LSTM(3, 4, bidirectional=True, proj_size=2).get_expected_hidden_size(na.ones(5, 6, 3))
            (2, 6, 2)
        """
        if batch_sizes is not None:
            raise NotImplementedError("get_expected_hidden_size: packed sequences (batch_sizes) are not supported")
        mini_batch = input.shape[0] if self.batch_first else input.shape[1]
        num_directions = 2 if self.bidirectional else 1
        return (self.num_layers * num_directions, mini_batch, self.proj_size or self.hidden_size)

    def check_hidden_size(self, hx: Tensor, expected_hidden_size, msg: str = "Expected hidden size {}, got {}") -> None:
        """Raise torch's ``RuntimeError`` unless ``hx.shape == expected_hidden_size``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import GRU
            >>> GRU(3, 4).check_hidden_size(na.zeros(1, 2, 4), (1, 2, 4)) is None
            True
        """
        if tuple(hx.shape) != tuple(expected_hidden_size):
            raise RuntimeError(msg.format(tuple(expected_hidden_size), list(hx.shape)))

    def check_forward_args(self, input: Tensor, hidden, batch_sizes=None) -> None:
        """:meth:`check_input`, then the shape of the initial state (for LSTM, ``hidden`` is ``(h_0, c_0)``).

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import RNN
            >>> RNN(3, 4).check_forward_args(na.ones(5, 2, 3), na.zeros(1, 2, 4)) is None
            True
        """
        self.check_input(input, batch_sizes)
        expected = self.get_expected_hidden_size(input, batch_sizes)
        if self.mode != "LSTM":
            self._check_hidden_dtype(hidden, "hx")
            self.check_hidden_size(hidden, expected)
            return
        self._check_hidden_dtype(hidden[0], "hx[0]")
        self._check_hidden_dtype(hidden[1], "hx[1]")
        self.check_hidden_size(hidden[0], expected, "Expected hidden[0] size {}, got {}")
        cell = (expected[0], expected[1], self.hidden_size)
        self.check_hidden_size(hidden[1], cell, "Expected hidden[1] size {}, got {}")

    def _check_hidden_dtype(self, hx: Tensor, name: str) -> None:
        # torch fails inside its kernel here; the framework's ops would promote silently instead
        weight = getattr(self, self._flat_weights_names[0])
        if hx.dtype != weight.dtype and not _autocasting():
            raise RuntimeError(f"{type(self).__name__}: {name} must have the type {weight.dtype} (the parameters'), "
                               f"got {hx.dtype}")

    # ------------------------------------------------------------------ forward
    def _forward(self, input, hx):
        """The shared forward: ``(output, h_n)`` and ``c_n`` (None except for LSTM), torch's shapes."""
        name = type(self).__name__
        x = _tensor(input, name)
        lstm = self.mode == "LSTM"
        if x.ndim not in (2, 3):
            noun = " tensor" if name == "RNN" else ""      # torch's own wording differs by one word
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {x.ndim}D{noun} instead")
        batched = x.ndim == 3
        if lstm and hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"LSTM: hx must be a tuple (h_0, c_0), got {type(hx).__name__}")
            hx = (_tensor(hx[0], name), _tensor(hx[1], name))
            dims = (hx[0].ndim, hx[1].ndim)
            if batched and dims != (3, 3):
                raise RuntimeError(f"For batched 3-D input, hx and cx should also be 3-D but got "
                                   f"({dims[0]}-D, {dims[1]}-D) tensors")
            if not batched and dims != (2, 2):
                raise RuntimeError(f"For unbatched 2-D input, hx and cx should also be 2-D but got "
                                   f"({dims[0]}-D, {dims[1]}-D) tensors")
        elif hx is not None:
            hx = _tensor(hx, name)
            if batched and hx.ndim != 3:
                raise RuntimeError(f"For batched 3-D input, hx should also be 3-D but got {hx.ndim}-D tensor")
            if not batched and hx.ndim != 2:
                raise RuntimeError(f"For unbatched 2-D input, hx should also be 2-D but got {hx.ndim}-D tensor")
        # an unbatched (L, H_in) input is one sequence: a batch of one where batch_first puts the batch
        batch_dim = 0 if self.batch_first else 1
        if not batched:
            x = x.unsqueeze(batch_dim)
            if hx is not None:
                hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1)) if lstm else hx.unsqueeze(1)
        if hx is None:
            self.check_input(x)
            num_directions = 2 if self.bidirectional else 1
            h_shape = (self.num_layers * num_directions, x.shape[batch_dim], self.proj_size or self.hidden_size)
            h0 = _zeros(h_shape, x)
            c0 = _zeros(h_shape[:2] + (self.hidden_size,), x) if lstm else None
        else:
            self.check_forward_args(x, hx)
            h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
        if self.batch_first:
            x = x.transpose(0, 1)
        if x.shape[0] == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
        out, h_n, c_n = self._layers(x, h0, c0)
        if self.batch_first:
            out = out.transpose(0, 1)
        if not batched:
            out, h_n = out.squeeze(batch_dim), h_n.squeeze(1)
            c_n = None if c_n is None else c_n.squeeze(1)
        return out, h_n, c_n

    def _layers(self, x: Tensor, h0: Tensor, c0):
        """Every layer and direction over the time-major ``x`` ``(L, N, H_in)``."""
        num_directions = 2 if self.bidirectional else 1
        layer_input = x
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(num_directions):
                k = layer * num_directions + direction
                weights = dict(zip(("w_ih", "w_hh", "b_ih", "b_hh", "w_hr"), self._weights(layer, direction)))
                # the input part of every gate for the whole sequence: one GEMM, not one per step
                gi = F.linear(layer_input, weights["w_ih"], weights["b_ih"])
                out, h, c = self._scan(gi, h0[k], None if c0 is None else c0[k], weights, reverse=direction == 1)
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
            layer_input = outputs[0] if num_directions == 1 else cat(outputs, -1)
            # torch: dropout on each layer's output but the last, in training only
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        return layer_input, stack(h_n, 0), (stack(c_n, 0) if c0 is not None else None)

    def _weights(self, layer: int, direction: int):
        suffix = "_reverse" if direction == 1 else ""
        get = lambda stem: getattr(self, f"{stem}_l{layer}{suffix}", None)
        return (get("weight_ih"), get("weight_hh"), get("bias_ih") if self.bias else None,
                get("bias_hh") if self.bias else None, get("weight_hr") if self.proj_size > 0 else None)

    def _scan(self, gi: Tensor, h: Tensor, c, w: dict, reverse: bool):
        """One direction of one layer: the hidden part of the gates, step by step."""
        steps = gi.shape[0]
        step_inputs = _time_steps(gi)
        outputs = [None] * steps
        mode = self.mode
        act = F.relu if mode == "RNN_RELU" else F.tanh
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            if mode == "LSTM":
                h, c = _lstm_step(step_inputs[t], h, c, w["w_hh"], w["b_hh"], w["w_hr"])
            elif mode == "GRU":
                h = _gru_step(step_inputs[t], h, w["w_hh"], w["b_hh"])
            else:
                h = _rnn_step(step_inputs[t], h, w["w_hh"], w["b_hh"], act)
            outputs[t] = h      # the reverse direction's output at t is its state after reading t..L-1
        return stack(outputs, 0), h, c

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


class RNN(RNNBase):
    """torch's ``nn.RNN``: a multi-layer Elman RNN, ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``
    (``nonlinearity='relu'``: ReLU instead of tanh).

    ``forward(input, hx=None)`` takes ``input`` ``(L, N, H_in)`` (``(N, L, H_in)`` with ``batch_first``,
    ``(L, H_in)`` unbatched) and ``hx`` ``(D * num_layers, N, H_out)`` (``(D * num_layers, H_out)``
    unbatched; zeros when omitted), and returns ``(output, h_n)``: ``output`` ``(L, N, D * H_out)``, the
    last layer's state at every step (the two directions concatenated), and ``h_n`` the final state of
    every layer and direction (index ``layer * D + direction``). ``dropout`` applies to each layer's
    output but the last, in training only. Parameters: see :class:`RNNBase`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.rnn import RNN
        >>> rnn = RNN(10, 20, 2)
        >>> output, h_n = rnn(na.randn(5, 3, 10), na.randn(2, 3, 20))
        >>> output.shape, h_n.shape
        ((5, 3, 20), (2, 3, 20))
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None, **kwargs) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if kwargs:
            raise TypeError(f"RNN.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}")
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__(mode, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        """``(output, h_n)`` for ``input`` and the initial state ``hx`` (zeros when None).

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import RNN
            >>> out, h_n = RNN(3, 4, bidirectional=True)(na.randn(6, 3))       # unbatched (L, H_in)
            >>> out.shape, h_n.shape
            ((6, 8), (2, 4))
        """
        out, h_n, _ = self._forward(input, hx)
        return out, h_n


class LSTM(RNNBase):
    """torch's ``nn.LSTM``: gates ``i, f, g, o`` (that order in the weight rows) with
    ``i, f, o = sigmoid(W_i* x_t + b_i* + W_h* h_{t-1} + b_h*)``, ``g = tanh(...)``,
    ``c_t = f * c_{t-1} + i * g`` and ``h_t = o * tanh(c_t)``; with ``proj_size > 0``,
    ``h_t = W_hr (o * tanh(c_t))`` has ``proj_size`` features (``weight_hr_lk``).

    ``forward(input, hx=None)``: ``hx`` is ``(h_0, c_0)``, ``h_0`` ``(D * num_layers, N, H_out)`` and ``c_0``
    ``(D * num_layers, N, hidden_size)`` (without the ``N`` for an unbatched input; zeros when omitted);
    returns ``(output, (h_n, c_n))``. ``H_out`` is ``proj_size`` if it is positive, else ``hidden_size``.
    Everything else is as :class:`RNN`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.rnn import LSTM
        >>> lstm = LSTM(10, 20, 2)
        >>> output, (h_n, c_n) = lstm(na.randn(5, 3, 10), (na.randn(2, 3, 20), na.randn(2, 3, 20)))
        >>> output.shape, h_n.shape, c_n.shape
        ((5, 3, 20), (2, 3, 20), (2, 3, 20))
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device=device, dtype=dtype)

    def get_expected_cell_size(self, input: Tensor, batch_sizes=None) -> tuple[int, int, int]:
        """The shape ``c_0`` must have for this (3-D) input: ``(D * num_layers, N, hidden_size)``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import LSTM
            >>> LSTM(3, 4, proj_size=2).get_expected_cell_size(na.ones(5, 6, 3))
            (1, 6, 4)
        """
        layers, batch, _ = self.get_expected_hidden_size(input, batch_sizes)
        return (layers, batch, self.hidden_size)

    def forward(self, input, hx=None):
        """``(output, (h_n, c_n))`` for ``input`` and the initial state ``hx = (h_0, c_0)`` (zeros when None).

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import LSTM
            >>> out, (h_n, c_n) = LSTM(3, 4, batch_first=True, proj_size=2)(na.randn(2, 5, 3))
            >>> out.shape, h_n.shape, c_n.shape
            ((2, 5, 2), (1, 2, 2), (1, 2, 4))
        """
        out, h_n, c_n = self._forward(input, hx)
        return out, (h_n, c_n)


class GRU(RNNBase):
    """torch's ``nn.GRU``: gates ``r, z, n`` (that order in the weight rows) with
    ``r, z = sigmoid(W_i* x_t + b_i* + W_h* h_{t-1} + b_h*)``,
    ``n = tanh(W_in x_t + b_in + r * (W_hn h_{t-1} + b_hn))`` (torch's variant: ``r`` multiplies after the
    hidden product) and ``h_t = (1 - z) * n + z * h_{t-1}``. Inputs and outputs are as :class:`RNN`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.rnn import GRU
        >>> gru = GRU(10, 20, 2)
        >>> output, h_n = gru(na.randn(5, 3, 10), na.randn(2, 3, 20))
        >>> output.shape, h_n.shape
        ((5, 3, 20), (2, 3, 20))
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=None, **kwargs) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if kwargs:
            raise TypeError(f"GRU.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}")
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)

    def forward(self, input, hx=None):
        """``(output, h_n)`` for ``input`` and the initial state ``hx`` (zeros when None).

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import GRU
            >>> out, h_n = GRU(3, 4, num_layers=2, batch_first=True)(na.randn(2, 5, 3))
            >>> out.shape, h_n.shape
            ((2, 5, 4), (2, 2, 4))
        """
        out, h_n, _ = self._forward(input, hx)
        return out, h_n


# ----------------------------------------------------------------------------- the cells
class RNNCellBase(Module):
    """What the cells share (torch's ``nn.RNNCellBase``): ``weight_ih`` ``(num_chunks * hidden_size,
    input_size)``, ``weight_hh`` ``(num_chunks * hidden_size, hidden_size)`` and, with ``bias``, ``bias_ih`` /
    ``bias_hh`` ``(num_chunks * hidden_size,)``, all drawn from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``.

    Example::

        >>> from neural_arch.nn.rnn import RNNCellBase
        >>> cell = RNNCellBase(3, 2, bias=True, num_chunks=4)
        >>> cell.weight_ih.shape, cell.weight_hh.shape, cell.bias_ih.shape
        ((8, 3), (8, 2), (8,))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device=None,
                 dtype=None) -> None:
        super().__init__()
        if int(input_size) < 0 or int(hidden_size) < 0:
            raise RuntimeError(f"{type(self).__name__}: input_size and hidden_size must be non-negative, got "
                               f"{input_size} and {hidden_size}")
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self.bias = bool(bias)
        dtype = np.float32 if dtype is None else dtype
        rows = int(num_chunks) * self.hidden_size
        self.weight_ih = Parameter(np.empty((rows, self.input_size), dtype=dtype), device=device)
        self.weight_hh = Parameter(np.empty((rows, self.hidden_size), dtype=dtype), device=device)
        if self.bias:
            self.bias_ih = Parameter(np.empty((rows,), dtype=dtype), device=device)
            self.bias_hh = Parameter(np.empty((rows,), dtype=dtype), device=device)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every parameter from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``.

        Example::

            >>> from neural_arch.nn.rnn import GRUCell
            >>> cell = GRUCell(2, 4)
            >>> cell.reset_parameters()
            >>> float(abs(cell.weight_hh.data).max()) <= 0.5
            True
        """
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        nonlinearity = self.__dict__.get("nonlinearity", "tanh")
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity}"
        return s

    def _inputs(self, input, hx, name: str, state: bool = False):
        """torch's checks of a cell's input and state; returns ``(x, states, batched)``, both 2-D."""
        x = _tensor(input, name)
        if x.ndim not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {x.ndim}D instead")
        if hx is None:
            states = None
        elif state:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"{name}: hx must be a tuple (h_0, c_0), got {type(hx).__name__}")
            states = [_tensor(v, name) for v in hx]
            for k, v in enumerate(states):
                if v.ndim not in (1, 2):
                    raise ValueError(f"{name}: Expected hx[{k}] to be 1D or 2D, got {v.ndim}D instead")
        else:
            states = [_tensor(hx, name)]
            if states[0].ndim not in (1, 2):
                raise ValueError(f"{name}: Expected hidden to be 1D or 2D, got {states[0].ndim}D instead")
        batched = x.ndim == 2
        if states is not None and any(v.ndim != x.ndim for v in states):
            # torch fails later with an index error; say what to do instead
            raise RuntimeError(f"{name}: a {x.ndim}-D input needs {x.ndim}-D hidden state(s), got "
                               f"{[v.ndim for v in states]}-D")
        if not batched:
            x = x.unsqueeze(0)
            states = None if states is None else [v.unsqueeze(0) for v in states]
        if not _autocasting():
            for what, t in [("input", x)] + [(f"hx[{k}]" if state else "hx", v) for k, v in enumerate(states or [])]:
                if t.dtype != self.weight_ih.dtype:
                    raise RuntimeError(f"{name}: {what} must have the type {self.weight_ih.dtype} (the parameters'), "
                                       f"got {t.dtype}")
        if x.shape[1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {x.shape[1]} expected {self.input_size}")
        if states is None:
            zero = _zeros((x.shape[0], self.hidden_size), x)
            states = [zero, zero] if state else [zero]
        for k, v in enumerate(states):
            label = k if state else ""
            if v.shape[0] != x.shape[0]:
                raise RuntimeError(f"Input batch size {x.shape[0]} doesn't match hidden{label} batch size {v.shape[0]}")
            if v.shape[1] != self.hidden_size:
                raise RuntimeError(f"hidden{label} has inconsistent hidden_size: got {v.shape[1]}, expected "
                                   f"{self.hidden_size}")
        return x, states, batched


class RNNCell(RNNCellBase):
    """torch's ``nn.RNNCell``: one step, ``h' = tanh(W_ih x + b_ih + W_hh h + b_hh)`` (ReLU with
    ``nonlinearity='relu'``). ``forward(input, hx=None)``: ``input`` ``(N, input_size)`` or ``(input_size,)``,
    ``hx`` of the matching ``(N, hidden_size)`` / ``(hidden_size,)`` shape (zeros when None); returns ``h'``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.rnn import RNNCell
        >>> cell = RNNCell(10, 20)
        >>> hx = na.randn(3, 20)
        >>> for x_t in na.randn(6, 3, 10):
        ...     hx = cell(x_t, hx)
        >>> hx.shape
        (3, 20)
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        """The next hidden state for ``input`` and ``hx``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import RNNCell
            >>> RNNCell(3, 2, nonlinearity="relu")(na.ones(3)).shape      # unbatched
            (2,)
        """
        if self.nonlinearity == "tanh":
            act = F.tanh
        elif self.nonlinearity == "relu":
            act = F.relu
        else:  # torch checks it here, at the call, not in the constructor
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        x, (h,), batched = self._inputs(input, hx, "RNNCell")
        h = _rnn_step(F.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh, act)
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """torch's ``nn.LSTMCell``: one LSTM step (gates ``i, f, g, o`` as :class:`LSTM`).
    ``forward(input, hx=None)`` with ``hx = (h, c)`` (zeros when None) returns ``(h', c')``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.rnn import LSTMCell
        >>> cell = LSTMCell(10, 20)
        >>> hx, cx = na.randn(3, 20), na.randn(3, 20)
        >>> for x_t in na.randn(2, 3, 10):
        ...     hx, cx = cell(x_t, (hx, cx))
        >>> hx.shape, cx.shape
        ((3, 20), (3, 20))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        """``(h', c')`` for ``input`` and ``hx = (h, c)``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import LSTMCell
            >>> h, c = LSTMCell(3, 2)(na.ones(4, 3))
            >>> h.shape, c.shape
            ((4, 2), (4, 2))
        """
        x, (h, c), batched = self._inputs(input, hx, "LSTMCell", state=True)
        h, c = _lstm_step(F.linear(x, self.weight_ih, self.bias_ih), h, c, self.weight_hh, self.bias_hh)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """torch's ``nn.GRUCell``: one GRU step (gates ``r, z, n`` as :class:`GRU`).
    ``forward(input, hx=None)`` returns ``h'``; shapes as :class:`RNNCell`.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn.rnn import GRUCell
        >>> cell = GRUCell(10, 20)
        >>> hx = na.randn(3, 20)
        >>> for x_t in na.randn(6, 3, 10):
        ...     hx = cell(x_t, hx)
        >>> hx.shape
        (3, 20)
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        """The next hidden state for ``input`` and ``hx``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch.nn.rnn import GRUCell
            >>> GRUCell(3, 2)(na.ones(4, 3)).shape
            (4, 2)
        """
        x, (h,), batched = self._inputs(input, hx, "GRUCell")
        h = _gru_step(F.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh)
        return h if batched else h.squeeze(0)
