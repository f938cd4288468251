"""GPU memory, streams, copies and timing for the SDK's tools, on cuda-python, without torch.

The conformance suite, ``kvcodec bench`` and the manager's device pools use this module, so a
codec author with a GPU and no deep-learning framework can prove a codec on the GPU. It needs the
``gpu`` extra (``pip install 'kvcodec-sdk[gpu]'``: ``cuda-core`` and ``cuda-bindings`` of the CUDA
major the SDK's wheels are built for); :func:`unavailable_reason` says what is missing.

Memory is handed out as :class:`DeviceArray`: a typed, strided view of device or pinned host
memory that torch, CuPy, JAX, Numba and cuda.core take without a copy (through DLPack,
``__cuda_array_interface__`` or, for host memory, ``__array_interface__``).

Streams are ``cuda.core.Stream`` objects (they speak ``__cuda_stream__``, so every SDK call
takes them). Functions that take a ``stream`` accept anything :func:`stream_handle` accepts.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

import numpy as np

from . import _interop, _native

__all__ = [
    "DeviceArray", "Timer", "available", "unavailable_reason", "device", "new_stream", "side_stream", "empty",
    "pinned", "to_device", "copy_bytes", "synchronize", "stream_done", "stream_handle", "INSTALL_HINT",
]

#: What to install for the GPU tooling.
INSTALL_HINT = "pip install 'kvcodec-sdk[gpu]' (cuda-core and cuda-bindings for CUDA 13)"

stream_handle = _interop.stream_handle

_LOCK = threading.Lock()
_SIDE: dict[int, Any] = {}

# DLPack device types.
_DL_CPU, _DL_CUDA = 1, 2

# numpy dtypes, and the names this module takes, to DLPack type codes of _native.dlpack_capsule.
_DTYPE_NAMES = {"bfloat16": "bf16", "float8_e4m3fn": "f8e4m3", "float8_e4m3": "f8e4m3", "float8_e5m2": "f8e5m2"}


def _core() -> Any:
    try:
        import cuda.core as core
    except ImportError as exc:
        raise RuntimeError(f"the GPU tooling needs cuda-python, which is not importable ({exc}); {INSTALL_HINT}") from None
    return core


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def unavailable_reason() -> str | None:
    """None when the GPU tooling can run here; else one sentence saying what is missing."""
    try:
        count = _native.driver_info()["device_count"]
    except Exception as exc:  # a broken driver must not break a report
        return f"the CUDA driver could not be queried ({exc})"
    if count == 0:
        return "no CUDA device (or no CUDA driver) is visible"
    try:
        import cuda.core  # noqa: F401
        from cuda.bindings import driver  # noqa: F401
    except ImportError as exc:
        return f"cuda-python is not importable ({exc}); {INSTALL_HINT}"
    return None


def available() -> bool:
    """True when a CUDA device and cuda-python are present."""
    return unavailable_reason() is None


def _ordinal(dev: Any) -> int:
    label, ordinal = _interop.parse_device(dev)
    if ordinal < 0:
        raise ValueError(f"device is {dev!r}; the GPU tooling needs a CUDA device ('cuda', 'cuda:N' or an ordinal)")
    return ordinal


def device(dev: Any = "cuda:0") -> Any:
    """The ``cuda.core.Device`` of ``dev`` (``"cuda"``, ``"cuda:N"`` or an ordinal), made current
    on this thread (its primary context, which the SDK's native code shares)."""
    core = _core()
    d = core.Device(_ordinal(dev))
    d.set_current()
    return d


def new_stream(dev: Any = "cuda:0", *, priority: int | None = None) -> Any:
    """A new non-blocking ``cuda.core.Stream`` on ``dev`` (``priority``: lower runs first;
    default the lowest)."""
    core = _core()
    return device(dev).create_stream(options=core.StreamOptions(nonblocking=True, priority=priority))


def side_stream(dev: Any = "cuda:0") -> Any:
    """One high-priority stream per device for the tools' own copies: never a stream a caller
    blocks or hands to a codec, so reading memory never waits behind a blocked codec stream."""
    ordinal = _ordinal(dev)
    with _LOCK:
        s = _SIDE.get(ordinal)
        if s is None:
            device(ordinal)
            _least, greatest = _check(_driver().cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
            s = _SIDE[ordinal] = new_stream(ordinal, priority=greatest)
        return s


def _check(result: Any, call: str) -> Any:
    """The values of a cuda.bindings call; raises with the driver's error name otherwise."""
    err, *values = result if isinstance(result, tuple) else (result,)
    driver = _driver()
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)[1]
        raise RuntimeError(f"{call} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def synchronize(stream: Any = None, dev: Any = "cuda:0") -> None:
    """Waits for ``stream`` (anything :func:`stream_handle` takes), or for the whole device when
    ``stream`` is None."""
    if stream is None:
        device(dev)
        _check(_driver().cuCtxSynchronize(), "cuCtxSynchronize")
    else:
        _check(_driver().cuStreamSynchronize(stream_handle(stream)), "cuStreamSynchronize")


def stream_done(stream: Any) -> bool:
    """True when every piece of work queued on ``stream`` has finished (``cuStreamQuery``)."""
    driver = _driver()
    err = driver.cuStreamQuery(stream_handle(stream))[0]
    if err == driver.CUresult.CUDA_ERROR_NOT_READY:
        return False
    _check((err,), "cuStreamQuery")
    return True


def copy_bytes(dst: int, src: int, nbytes: int, stream: Any = None) -> None:
    """Queues a copy of ``nbytes`` from address ``src`` to ``dst`` (device, pinned or pageable host
    memory; unified addressing picks the direction) on ``stream``."""
    if nbytes:
        _check(_driver().cuMemcpyAsync(int(dst), int(src), int(nbytes), stream_handle(stream)), "cuMemcpyAsync")


class DeviceArray:
    """A typed view of device or pinned host memory, kept alive by ``owner``.

    ``kind`` is ``"device"`` (CUDA device memory) or ``"host"`` (pinned or other host memory the
    device can reach). ``strides`` are in bytes, as numpy's. Basic indexing (ints and step-1
    slices), :meth:`view` and :meth:`reshape` return views of the same memory."""

    def __init__(self, address: int, shape: Iterable[int], dtype: Any = np.uint8, *, kind: str = "device",
                 device_id: int = 0, strides: Iterable[int] | None = None, owner: Any = None):
        if kind not in ("device", "host"):
            raise ValueError(f"kind is {kind!r}; use 'device' or 'host'")
        self.address = int(address)
        self.shape = tuple(int(n) for n in shape)
        self.dtype = _as_dtype(dtype)
        self.kind = kind
        self.device_id = int(device_id)
        self.strides = _contiguous_strides(self.shape, self.dtype.itemsize) if strides is None else tuple(int(s) for s in strides)
        if len(self.strides) != len(self.shape):
            raise ValueError(f"strides {self.strides} do not match shape {self.shape}")
        self.owner = owner

    # -- shape ---------------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        return self.size == 0 or self.strides == _contiguous_strides(self.shape, self.dtype.itemsize)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={_type_name(self.dtype)}, kind={self.kind!r}, "
                f"device_id={self.device_id}, address={self.address:#x})")

    def __getitem__(self, key: Any) -> "DeviceArray":
        keys = key if isinstance(key, tuple) else (key,)
        if len(keys) > self.ndim:
            raise IndexError(f"{len(keys)} indices for a {self.ndim}-d array")
        address, shape, strides = self.address, [], []
        for axis, k in enumerate(keys):
            extent, stride = self.shape[axis], self.strides[axis]
            if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                i = int(k) + extent if k < 0 else int(k)
                if not 0 <= i < extent:
                    raise IndexError(f"index {k} is out of range for axis {axis} of extent {extent}")
                address += i * stride
            elif isinstance(k, slice):
                start, stop, step = k.indices(extent)
                if step != 1:
                    raise IndexError(f"slice step {k.step} on axis {axis}; DeviceArray takes step-1 slices only")
                address += start * stride
                shape.append(max(0, stop - start))
                strides.append(stride)
            else:
                raise TypeError(f"index {k!r} on axis {axis}; DeviceArray takes ints and step-1 slices")
        shape += self.shape[len(keys):]
        strides += self.strides[len(keys):]
        return self._derived(address, shape, self.dtype, strides)

    def view(self, dtype: Any) -> "DeviceArray":
        """The same bytes as ``dtype``: the last axis must be contiguous and its bytes divisible by
        the new item size."""
        new = _as_dtype(dtype)
        if new.itemsize == self.dtype.itemsize:
            return self._derived(self.address, self.shape, new, self.strides)
        if not self.shape or self.strides[-1] != self.dtype.itemsize:
            raise ValueError("view() with another item size needs a contiguous last axis")
        last = self.shape[-1] * self.dtype.itemsize
        if last % new.itemsize:
            raise ValueError(f"the last axis holds {last} bytes, not a multiple of {new.itemsize} ({_type_name(new)})")
        return self._derived(self.address, self.shape[:-1] + (last // new.itemsize,), new,
                             self.strides[:-1] + (new.itemsize,))

    def reshape(self, *shape: Any) -> "DeviceArray":
        """A view of a contiguous array with another shape (one extent may be -1)."""
        dims = list(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
        if not self.is_contiguous:
            raise ValueError(f"reshape() needs a contiguous array (strides {self.strides} for shape {self.shape})")
        if dims.count(-1) > 1:
            raise ValueError("reshape() takes at most one -1 extent")
        if -1 in dims:
            known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
            dims[dims.index(-1)] = self.size // known if known else 0
        if int(np.prod(dims, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape {self.size} elements into shape {tuple(dims)}")
        return self._derived(self.address, dims, self.dtype, None)

    def _derived(self, address: int, shape: Any, dtype: Any, strides: Any) -> "DeviceArray":
        """Another view of this array's memory (same kind, device and owner)."""
        return DeviceArray(address, shape, dtype, kind=self.kind, device_id=self.device_id, strides=strides,
                           owner=self.owner)

    # -- interchange ---------------------------------------------------------------------------

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.kind != "device":
            raise AttributeError("host memory exports __array_interface__, not __cuda_array_interface__")
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.address, False), "version": 3,
                "strides": None if self.is_contiguous else self.strides, "stream": None}

    @property
    def __array_interface__(self) -> dict:
        if self.kind != "host":
            raise AttributeError("device memory exports __cuda_array_interface__ and DLPack, not __array_interface__")
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.address, False), "version": 3,
                "strides": None if self.is_contiguous else self.strides}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DL_CUDA, self.device_id) if self.kind == "device" else (_DL_CPU, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any:
        """A DLPack capsule over this memory (no copy). The SDK orders nothing on ``stream``: the
        memory is ready when the producer's stream (the caller's own) is."""
        if copy:
            raise BufferError("DeviceArray exports without copying; copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"DeviceArray lives on DLPack device {self.__dlpack_device__()}, not {tuple(dl_device)}")
        item = self.dtype.itemsize
        if any(s % item for s in self.strides):
            raise BufferError(f"strides {self.strides} are not whole elements of {item} bytes")
        strides = [] if self.is_contiguous else [s // item for s in self.strides]
        dl_type, dl_id = self.__dlpack_device__()
        return _native.dlpack_capsule(self.address, list(self.shape), strides, _dl_code(self.dtype), dl_type, dl_id,
                                      self)

    # -- data ----------------------------------------------------------------------------------

    def numpy(self, stream: Any = None) -> np.ndarray:
        """The contents as a new numpy array, copied on ``stream`` (default: the device's side
        stream, which alone is synchronized)."""
        if not self.is_contiguous:
            raise ValueError("numpy() copies contiguous arrays; slice whole trailing axes")
        out = np.empty(self.shape, self.dtype)
        s = side_stream(self.device_id) if stream is None else stream
        copy_bytes(out.ctypes.data, self.address, self.nbytes, s)
        synchronize(s, self.device_id)
        return out

    def copy_from(self, array: Any, stream: Any = None) -> None:
        """Copies a host array of the same number of bytes in; synchronized when ``stream`` is
        None (then on the side stream), queued on ``stream`` otherwise (``array`` must then stay
        alive and unchanged until the stream has run)."""
        if not self.is_contiguous:
            raise ValueError("copy_from() fills contiguous arrays; slice whole trailing axes")
        src = np.ascontiguousarray(array)
        if src.nbytes != self.nbytes:
            raise ValueError(f"the source holds {src.nbytes} bytes; this array holds {self.nbytes}")
        s = side_stream(self.device_id) if stream is None else stream
        copy_bytes(self.address, src.ctypes.data, self.nbytes, s)
        if stream is None:
            synchronize(s, self.device_id)

    def take_rows(self, rows: Any) -> np.ndarray:
        """Rows ``rows`` (indices along axis 0) of an array with contiguous rows, as a new numpy
        array, copied on the side stream (synchronized)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        out = np.empty((rows.size,) + self.shape[1:], self.dtype)
        self._copy_rows(rows, out, to_host=True)
        return out

    def put_rows(self, rows: Any, values: Any) -> None:
        """Writes ``values`` (one row per index, or anything that broadcasts to them) into rows
        ``rows`` of an array with contiguous rows, on the side stream (synchronized)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        src = np.ascontiguousarray(np.broadcast_to(np.asarray(values, self.dtype), (rows.size,) + self.shape[1:]))
        self._copy_rows(rows, src, to_host=False)

    def _copy_rows(self, rows: np.ndarray, host: np.ndarray, *, to_host: bool) -> None:
        """One copy per row between rows ``rows`` of this array and the rows of ``host``."""
        if self.ndim < 1 or self.strides[1:] != _contiguous_strides(self.shape[1:], self.dtype.itemsize):
            raise ValueError("take_rows()/put_rows() need an array whose rows are contiguous")
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"rows reach {int(rows.min())}..{int(rows.max())}; axis 0 has extent {self.shape[0]}")
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        side = side_stream(self.device_id)
        for i, r in enumerate(rows.tolist()):
            here, there = self.address + r * self.strides[0], host.ctypes.data + i * row_bytes
            copy_bytes(there if to_host else here, here if to_host else there, row_bytes, side)
        synchronize(side, self.device_id)

    def fill_bytes(self, value: int, stream: Any = None) -> None:
        """Sets every byte to ``value`` (queued on ``stream``; synchronized when it is None)."""
        if not self.is_contiguous:
            raise ValueError("fill_bytes() fills contiguous arrays")
        if not 0 <= int(value) <= 255:
            raise ValueError(f"value is {value}; a byte is 0..255")
        s = side_stream(self.device_id) if stream is None else stream
        if self.nbytes:
            _check(_driver().cuMemsetD8Async(self.address, int(value), self.nbytes, stream_handle(s)), "cuMemsetD8Async")
        if stream is None:
            synchronize(s, self.device_id)


def _as_dtype(dtype: Any) -> np.dtype:
    name = str(dtype).removeprefix("torch.")
    if name in _DTYPE_NAMES:
        # No numpy type: bf16/fp8 are kept as same-size unsigned integers with their name.
        return np.dtype(np.uint16 if name == "bfloat16" else np.uint8, metadata={"kvcodec": _DTYPE_NAMES[name]})
    return np.dtype(dtype)


def _type_name(dtype: np.dtype) -> str:
    meta = dtype.metadata or {}
    return meta.get("kvcodec", dtype.name)


def _dl_code(dtype: np.dtype) -> str:
    meta = dtype.metadata or {}
    if "kvcodec" in meta:
        return meta["kvcodec"]
    if dtype.kind not in "uif":
        raise BufferError(f"dtype {dtype} has no DLPack equivalent here")
    return f"{dtype.kind}{dtype.itemsize}"


def _contiguous_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _buffer_array(buffer: Any, shape: Any, dtype: Any, kind: str, device_id: int) -> DeviceArray:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return DeviceArray(int(buffer.handle), shape, dtype, kind=kind, device_id=device_id, owner=buffer)


def _alloc_bytes(shape: Any, dtype: Any) -> int:
    return max(1, int(np.prod(shape, dtype=np.int64)) * _as_dtype(dtype).itemsize)


def empty(shape: Any, dtype: Any = np.uint8, dev: Any = "cuda:0") -> DeviceArray:
    """Uninitialised device memory, from the device's stream-ordered pool on the side stream,
    which is synchronized: the memory is usable on any stream at once."""
    d = device(dev)
    s = side_stream(d.device_id)
    buf = d.allocate(_alloc_bytes(shape, dtype), stream=s)
    s.sync()
    return _buffer_array(buf, shape, dtype, "device", d.device_id)


def pinned(shape: Any, dtype: Any = np.uint8, dev: Any = "cuda:0") -> DeviceArray:
    """Uninitialised pinned (page-locked) host memory; :meth:`DeviceArray.numpy` of it is a copy,
    ``np.asarray`` a view."""
    d = device(dev)
    buf = _core().LegacyPinnedMemoryResource().allocate(_alloc_bytes(shape, dtype))
    return _buffer_array(buf, shape, dtype, "host", d.device_id)


def to_device(array: np.ndarray, dev: Any = "cuda:0", *, pinned_memory: bool = False) -> DeviceArray:
    """A device (or, with ``pinned_memory``, pinned host) copy of a host array, made on the side
    stream, which alone is synchronized."""
    src = np.ascontiguousarray(array)
    out = pinned(src.shape, src.dtype, dev) if pinned_memory else empty(src.shape, src.dtype, dev)
    if pinned_memory:
        np.asarray(out)[...] = src
    else:
        out.copy_from(src)
    return out


class Timer:
    """Times work queued on a stream with CUDA events: ``with gpu.Timer(stream) as t:`` around
    the calls that queue it, then ``t.milliseconds`` (which waits for the end event)."""

    def __init__(self, stream: Any, dev: Any = "cuda:0"):
        device(dev)  # events are created in the device's context
        core = _core()
        self._stream = stream if isinstance(stream, core.Stream) else core.Stream.from_handle(stream_handle(stream))
        self._options = core.EventOptions(timing_enabled=True)
        self._start = self._end = None

    def __enter__(self) -> "Timer":
        self._start = self._stream.record(options=self._options)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end = self._stream.record(options=self._options)

    @property
    def milliseconds(self) -> float:
        if self._end is None:
            raise RuntimeError("the timer has not finished; read it after the with block")
        self._end.sync()
        return float(self._end - self._start)
