"""CUDA graphs: capture one training step and replay it with a single launch.

A training step of a small model is a few hundred tiny kernels; launching them from Python costs
more than running them. A CUDA graph records the kernels of one step once and replays them with
one call. This only works when the step never makes the host wait for the GPU (no ``.item()``,
no ``bool()`` on device values, no host copies): the framework's training step (forward,
``cross_entropy``, backward, ``clip_grad_norm_``, SGD/Adam) is written that way, and the strict
device tests check it on CPU.

Example (on a GPU machine)::

    from neural_arch.cuda.graphs import make_graphed_step

    static_x = Tensor(np.zeros((B, D), np.float32), device="cuda")   # fixed input buffers
    static_y = Tensor(np.zeros(B, np.int64), device="cuda")

    def step():
        opt.zero_grad(set_to_none=False)      # keep .grad arrays: the graph writes into them
        loss = F.cross_entropy(model(static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    graphed = make_graphed_step(step)         # warm-up runs + capture (runs the step 4 times)
    for x, y in batches:
        static_x.data[...] = cupy.asarray(x); static_y.data[...] = cupy.asarray(y)   # refill in place
        loss = graphed()                      # one launch; `loss` is the same static tensor

What a replay does *not* redo: Python. Anything decided on the host at capture time is frozen:
the learning rate and Adam's step count ``t`` (its bias correction is a Python float), the
shapes, the branches, the random numbers of dropout. Use SGD with a constant rate inside the
graph (or run the optimizer outside it), fixed shapes, and refresh inputs by copying into the
static buffers.

On CuPy (14.2 on an H200, 2026-11-28) a step with a matrix product cannot be captured: CuPy refuses
cuBLAS calls during stream capture (cupy/cupy#6290) and ``make_graphed_step`` raises a
``RuntimeError`` that says so. Elementwise work, reductions and CuPy's fused kernels -- an optimizer
step, say -- capture and replay (``tests/gpu/test_cuda_on_gpu.py``).
"""

from __future__ import annotations

from neural_arch import backend as _backend

__all__ = ["GraphedStep", "make_graphed_step"]


def _cupy():
    reason = _backend.gpu_unavailable_reason()
    if reason is not None:
        raise RuntimeError(
            f"make_graphed_step needs CuPy and a CUDA GPU (CUDA graphs are GPU-only): {reason}; "
            "on CPU call the step function directly")
    return _backend._try_cupy()


class GraphedStep:
    """A captured step: call it to replay. ``output`` is what the step returned at capture time
    (its arrays are overwritten by every replay).

    Example::

        graphed = make_graphed_step(step)           # a GraphedStep
        graphed()                                   # replay
        print(graphed.output)                       # the captured loss, refreshed by each replay
    """

    def __init__(self, cp, graph, stream, pool, output):
        self._cp = cp
        self.graph = graph
        self.stream = stream
        self.pool = pool  # the private memory pool the captured kernels use: must outlive the graph
        self.output = output

    def __call__(self):
        self.graph.launch(self.stream)
        # Later work on the caller's stream must see the replay's results.
        self._cp.cuda.get_current_stream().wait_event(self.stream.record())
        return self.output


def make_graphed_step(step_fn, warmup: int = 3) -> GraphedStep:
    """Capture ``step_fn()`` (no arguments) into a CUDA graph and return a replayable step.

    The step runs ``warmup`` times on a side stream first (so lazily created state, like optimizer
    moments, exists and the memory pool has the blocks the step needs), then once under capture.
    All of it allocates from a private memory pool kept by the returned object: blocks the
    captured kernels use are never handed to other code, so replays cannot overwrite live arrays.

    Raises ``RuntimeError`` without CuPy/a GPU, and whatever CUDA raises when the step does
    something a graph cannot hold (a host synchronisation, a host copy, a new ``cudaMalloc``).

    Example::

        from neural_arch.cuda.graphs import make_graphed_step
        def step():
            loss = F.cross_entropy(model(x_static), y_static); loss.backward(); opt.step(); opt.zero_grad()
            return loss
        graphed = make_graphed_step(step)          # needs CuPy and a GPU
        for x, y in batches:
            x_static.data[...] = cupy.asarray(x)   # refill the captured inputs in place (CuPy refuses
            y_static.data[...] = cupy.asarray(y)   # a host array here: move it to the device first)
            graphed()                                 # replays every kernel of the step
    """
    if not callable(step_fn):
        raise TypeError(f"make_graphed_step needs a callable, got {type(step_fn).__name__}")
    cp = _cupy()
    if warmup < 1:
        raise ValueError(f"make_graphed_step: warmup must be >= 1 (state must exist before capture), got {warmup}")
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.wait_event(cp.cuda.get_current_stream().record())
    with cp.cuda.using_allocator(pool.malloc), stream:
        for _ in range(warmup):
            step_fn()
        stream.synchronize()
        stream.begin_capture()
        try:
            output = step_fn()
        except NotImplementedError as exc:
            # CuPy refuses library calls (cuBLAS: every matrix product) while a stream captures
            # (cupy/cupy#6290); say what that means for the caller instead of CuPy's internals
            raise RuntimeError(
                f"make_graphed_step: CuPy {cp.__version__} cannot capture this step ({exc}): CuPy refuses "
                "cuBLAS calls, so any matrix product (Linear, attention), during stream capture "
                "(cupy/cupy#6290). Run the step eagerly, or capture only the part without matrix products "
                "(e.g. the optimizer step)") from exc
        finally:
            graph = stream.end_capture()
    return GraphedStep(cp, graph, stream, pool, output)
