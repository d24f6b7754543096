"""``neural_arch.cuda``: the CUDA device, its memory and its random numbers (torch.cuda's names).

Everything goes through CuPy, imported lazily. Without CuPy (or without a GPU) nothing raises at
import: :func:`is_available` is False, :func:`device_count` is 0, :func:`manual_seed` is silently
ignored (as in torch, so one seeding line serves CPU and GPU runs), and every other function
raises a ``RuntimeError`` that says what to install (``pip install neural_arch[gpu]``).

Example::

    >>> from neural_arch import cuda
    >>> n = cuda.device_count()                  # 0 on a machine without CuPy or a GPU
    >>> cuda.is_available() == (n > 0)
    True

Peak memory: CuPy's memory pool reports the bytes in use but keeps no peak, so the peak is
tracked by a CuPy memory hook, installed in the calling thread by the first call to
:func:`reset_peak_memory_stats` or :func:`max_memory_allocated`. Call
``reset_peak_memory_stats()`` before the code you measure; allocations made by other threads
(communication threads) are not seen by the hook.
"""

from __future__ import annotations

from neural_arch import backend as _backend

from . import graphs

__all__ = [
    "current_device",
    "device_count",
    "empty_cache",
    "get_device_name",
    "graphs",
    "is_available",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "memory_allocated",
    "memory_reserved",
    "reset_peak_memory_stats",
    "set_device",
    "synchronize",
]


def _cupy():
    """CuPy with a usable GPU, or a RuntimeError naming the fix."""
    reason = _backend.gpu_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"neural_arch.cuda needs CuPy and a CUDA GPU: {reason}")
    return _backend._try_cupy()


def is_available() -> bool:
    """True when CuPy imports and sees at least one CUDA GPU (never raises).

    Example::

        >>> from neural_arch import cuda
        >>> device = "cuda" if cuda.is_available() else "cpu"
    """
    return _backend.is_cupy_available()


def device_count() -> int:
    """Number of visible CUDA GPUs; 0 without CuPy or a driver (never raises).

    Example::

        >>> from neural_arch import cuda
        >>> cuda.device_count() >= 0             # 0 on a machine without a GPU
        True
    """
    cp = _backend._try_cupy()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001  (CuPy installed but no driver / no GPU)
        return 0


def _index(device) -> int:
    """A GPU ordinal from ``None`` (the current one), an int, ``"cuda:N"`` or a Device."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        dev = _backend.parse_device(device)
        if dev.type != "cuda":
            raise ValueError(f"expected a CUDA device, got {device!r}")
        index = dev.index
    n = device_count()
    if not 0 <= index < n:
        raise ValueError(f"CUDA device {index} does not exist: {n} GPU(s) visible "
                         f"(valid: {', '.join(f'cuda:{i}' for i in range(n)) or 'none'})")
    return index


def set_device(device) -> None:
    """Make ``device`` (an int, ``"cuda:N"``) the current GPU of this thread.

    Example::

        from neural_arch import cuda
        cuda.set_device("cuda:1")
        print(cuda.current_device())       # 1
    """
    cp = _cupy()
    cp.cuda.Device(_index(device)).use()


def current_device() -> int:
    """The ordinal of this thread's current GPU.

    Example::

        >>> from neural_arch import cuda
        >>> cuda.current_device() if cuda.is_available() else 0
        0
    """
    cp = _cupy()
    return int(cp.cuda.runtime.getDevice())


def synchronize(device=None) -> None:
    """Wait until every kernel queued on ``device`` (default: the current GPU) has finished.

    Example::

        from neural_arch import cuda
        t0 = time.perf_counter(); y = x @ x; cuda.synchronize()
        print(time.perf_counter() - t0)   # the matmul's real duration, not its launch
    """
    cp = _cupy()
    cp.cuda.Device(_index(device)).synchronize()


def get_device_name(device=None) -> str:
    """The GPU's name, e.g. ``"NVIDIA H100 80GB HBM3"``.

    Example::

        from neural_arch import cuda
        print(cuda.get_device_name(0))     # e.g. NVIDIA H100 80GB HBM3
    """
    cp = _cupy()
    name = cp.cuda.runtime.getDeviceProperties(_index(device))["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def manual_seed(seed: int) -> None:
    """Seed the current GPU's random generator (``xp.random`` of CuPy, used by ``dropout`` on GPU).

    Silently ignored without CuPy or a GPU, like ``torch.cuda.manual_seed``.

    Example::

        from neural_arch import cuda
        cuda.manual_seed(1234)             # dropout masks on this GPU repeat from here
    """
    if not is_available():
        return
    cp = _backend._try_cupy()
    cp.random.seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed the random generator of every visible GPU (ignored without CuPy or a GPU).

    Example::

        >>> from neural_arch import cuda
        >>> cuda.manual_seed_all(0)              # a no-op without a GPU
    """
    if not is_available():
        return
    cp = _backend._try_cupy()
    for i in range(device_count()):
        with cp.cuda.Device(i):
            cp.random.seed(int(seed))


# ------------------------------------------------------------------------------------------ memory
_peak: dict = {}        # device index -> peak bytes in use seen by the hook
_hook = None            # the installed memory hook (one per process; it is enabled per thread)


def _used_bytes(cp, index: int) -> int:
    with cp.cuda.Device(index):
        return int(cp.get_default_memory_pool().used_bytes())


def _ensure_hook(cp) -> None:
    """Install the peak-tracking CuPy memory hook in this thread (once)."""
    global _hook
    if _hook is not None:
        return
    pool = cp.get_default_memory_pool()

    class _PeakHook(cp.cuda.MemoryHook):
        name = "neural_arch.peak"

        def malloc_postprocess(self, **kwargs):  # device_id, size, mem_size, mem_ptr, pmem_id
            device_id = kwargs.get("device_id", 0)
            used = int(pool.used_bytes())
            if used > _peak.get(device_id, 0):
                _peak[device_id] = used

    _hook = _PeakHook()
    _hook.__enter__()  # memory hooks are per thread: enabled in the caller's thread from now on


def memory_allocated(device=None) -> int:
    """Bytes of GPU memory held by live arrays on ``device`` (CuPy's default pool, ``used_bytes``).

    Example::

        from neural_arch import cuda
        x = neural_arch.zeros(1024, 1024, device="cuda")
        print(cuda.memory_allocated())      # at least 4 MiB
    """
    cp = _cupy()
    return _used_bytes(cp, _index(device))


def memory_reserved(device=None) -> int:
    """Bytes the memory pool holds from CUDA, in use or cached (``total_bytes``).

    Example::

        from neural_arch import cuda
        print(cuda.memory_reserved() >= cuda.memory_allocated())   # True
    """
    cp = _cupy()
    with cp.cuda.Device(_index(device)):
        return int(cp.get_default_memory_pool().total_bytes())


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since the last :func:`reset_peak_memory_stats` (see the
    module docstring: tracked from the first call of either function on).

    Example::

        from neural_arch import cuda
        cuda.reset_peak_memory_stats()
        loss = model(x).sum(); loss.backward()
        print(cuda.max_memory_allocated() / 2**20, "MiB at the peak")
    """
    cp = _cupy()
    index = _index(device)
    _ensure_hook(cp)
    used = _used_bytes(cp, index)
    peak = max(_peak.get(index, 0), used)
    _peak[index] = peak
    return peak


def reset_peak_memory_stats(device=None) -> None:
    """Start peak tracking afresh at the current usage.

    Example::

        from neural_arch import cuda
        cuda.reset_peak_memory_stats()
        step()
        print(cuda.max_memory_allocated())
    """
    cp = _cupy()
    index = _index(device)
    _ensure_hook(cp)
    _peak[index] = _used_bytes(cp, index)


def empty_cache() -> None:
    """Return the memory pool's cached, unused blocks to CUDA.

    Example::

        from neural_arch import cuda
        cuda.empty_cache()
        print(cuda.memory_reserved())     # what the pool still holds from CUDA
    """
    cp = _cupy()
    cp.get_default_memory_pool().free_all_blocks()
