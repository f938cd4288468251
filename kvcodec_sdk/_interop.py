"""Conversions from Python objects to what the native codec takes: pointers, streams, devices."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

# cudaStreamLegacy and cudaStreamPerThread handles.
_LEGACY_STREAM = 1
_PER_THREAD_STREAM = 2


def parse_device(device: Any) -> tuple[str, int]:
    """Returns ``("cpu", -1)`` or ``("cuda:N", N)`` for ``"cpu"``, ``"cuda"``, ``"cuda:N"``, an int
    or a ``torch.device``."""
    if isinstance(device, bool):
        raise ValueError(f"device is {device!r}; use 'cpu', 'cuda', 'cuda:N' or a device ordinal")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device is {device}; a CUDA device ordinal must be >= 0 (use 'cpu' for the CPU)")
        return f"cuda:{device}", device
    text = str(device)
    if text == "cpu":
        return "cpu", -1
    if text == "cuda":
        return "cuda:0", 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return text, int(text[5:])
    raise ValueError(f"device is {device!r}; use 'cpu', 'cuda', 'cuda:N' or a device ordinal")


def stream_handle(stream: Any) -> int:
    """A raw ``cudaStream_t`` value from None (0), an int, a ``torch.cuda.Stream`` or any object
    implementing ``__cuda_stream__`` (a ``cuda.core.Stream``, CuPy's streams)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream, not a bool")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream handle is {stream}; it must be >= 0")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if isinstance(value, tuple) and len(value) == 2:
            return int(value[1])
        raise TypeError(f"stream.__cuda_stream__ returned {value!r}; expected (version, handle)")
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is not None:
        return int(handle)
    raise TypeError(
        f"stream is a {type(stream).__name__}; pass an int handle, a torch.cuda.Stream or an object with __cuda_stream__"
    )


def keep_for_stream(objects: Any, stream: Any, handle: int) -> None:
    """Keeps torch CUDA tensors handed to a call queued on ``stream`` (whose
    :func:`stream_handle` is ``handle``) allocated until the stream has run that far.

    torch's caching allocator hands a freed block to the next allocation on the tensor's own
    stream at once; a codec call queued on another stream may not have read it yet (a temporary
    index tensor, or a converted copy of one). ``Tensor.record_stream`` makes the allocator wait
    for ``stream`` first. Objects that are not CUDA tensors are left alone."""
    if stream is None or isinstance(stream, bool):
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return
    tensors = [o for o in objects if isinstance(o, torch.Tensor) and o.is_cuda]
    if not tensors:
        return
    if not isinstance(stream, torch.cuda.Stream):
        if handle in (0, _LEGACY_STREAM, _PER_THREAD_STREAM):
            return  # the null stream, or a stream the codec refuses
        stream = torch.cuda.ExternalStream(handle, device=tensors[0].device)
    for t in tensors:
        try:
            t.record_stream(stream)
        except RuntimeError:
            pass  # memory not from the caching allocator (from_blob, DLPack import): nothing to keep


def _check_writable_contiguous(obj: Any, what: str) -> None:
    """A buffer a codec writes through must be writable and C-contiguous (else the codec, which
    sees only its address, would write through a read-only or strided view)."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.writeable:
            raise ValueError(f"{what} is a read-only array; the codec writes into it")
        if not obj.flags.c_contiguous:
            raise ValueError(f"{what} is not C-contiguous (strides {obj.strides}); pass a contiguous array")
    elif hasattr(obj, "is_contiguous") and hasattr(obj, "data_ptr"):  # torch.Tensor
        if not obj.is_contiguous():
            raise ValueError(f"{what} is not contiguous (strides {tuple(obj.stride())}); pass a contiguous tensor")


def writable_pointer(obj: Any, what: str) -> tuple[int, bool | None]:
    """:func:`data_pointer` of a buffer a codec writes: it must be writable and contiguous."""
    _check_writable_contiguous(obj, what)
    return data_pointer(obj, what)


def data_pointer(obj: Any, what: str) -> tuple[int, bool | None]:
    """Address of a buffer and whether it is device memory (None when unknown).

    Accepts an int address, a numpy array, a torch tensor, or anything with
    ``__cuda_array_interface__`` / ``__array_interface__``.
    """
    if isinstance(obj, bool):
        raise TypeError(f"{what} must be an address or an array, not a bool")
    if isinstance(obj, int):
        if obj < 0:
            raise ValueError(f"{what} is {obj}; an address must be >= 0")
        return obj, None
    if isinstance(obj, np.ndarray):
        return obj.ctypes.data, False
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):  # torch.Tensor
        return int(obj.data_ptr()), bool(obj.is_cuda)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0]), True
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return int(ai["data"][0]), False
    raise TypeError(f"{what} is a {type(obj).__name__}; pass an address, a numpy array or a torch tensor")


def page_indices(obj: Any, num_pages: int | None) -> tuple[int, int, bool | None, Any]:
    """(address, number of pairs, is_device, owner) of a PageIndexPair array.

    ``owner`` is the object that owns the memory (a converted copy when ``obj`` was a list):
    the caller keeps it alive until the codec call returns.

    ``obj`` is an int32 array of shape (N, 2) (columns dst, src) or a flat one of 2N values, on
    the host (numpy, CPU tensor) or the device (CUDA tensor); or an address with ``num_pages``.
    """
    if isinstance(obj, int) and not isinstance(obj, bool):
        if num_pages is None:
            raise ValueError("page_indices is a raw address; pass num_pages too")
        return obj, int(num_pages), None, None
    dtype = getattr(obj, "dtype", None)
    shape = tuple(getattr(obj, "shape", ()))
    if dtype is None:
        converted = np.asarray(obj)
        if converted.size and converted.dtype.kind not in "iu":
            raise TypeError(f"page_indices holds {converted.dtype} values; slot indices must be integers")
        if converted.size and (converted.min() < np.iinfo(np.int32).min or converted.max() > np.iinfo(np.int32).max):
            raise ValueError("page_indices holds values outside the int32 range")
        obj = np.ascontiguousarray(converted, dtype=np.int32)
        dtype, shape = obj.dtype, obj.shape
    if str(dtype) not in ("int32", "torch.int32"):
        raise TypeError(f"page_indices has dtype {dtype}; it must be int32 (pairs of dst, src)")
    if len(shape) == 2 and shape[1] == 2:
        count = shape[0]
    elif len(shape) == 1 and shape[0] % 2 == 0:
        count = shape[0] // 2
    elif len(shape) == 1 and shape[0] == 0:
        count = 0
    else:
        raise ValueError(f"page_indices has shape {shape}; expected (N, 2) or (2N,)")
    if isinstance(obj, np.ndarray):
        contiguous = obj.flags["C_CONTIGUOUS"]
    else:
        flag = getattr(obj, "is_contiguous", True)  # torch: a method; kvcodec_sdk.gpu.DeviceArray: a property
        contiguous = bool(flag() if callable(flag) else flag)
    if not contiguous:
        raise ValueError("page_indices must be contiguous")
    if num_pages is not None:
        if num_pages < 0 or num_pages > count:
            raise ValueError(f"num_pages is {num_pages}; page_indices holds {count} pairs")
        count = num_pages
    address, is_device = data_pointer(obj, "page_indices")
    return address, count, is_device, obj


def host_pairs(owner: Any, count: int) -> np.ndarray:
    """A (count, 2) int32 numpy view of host index pairs held by ``owner`` (numpy or CPU tensor)."""
    if isinstance(owner, np.ndarray):
        arr = owner
    elif hasattr(owner, "numpy"):
        arr = owner.numpy()
    else:
        arr = np.asarray(owner)
    return arr.reshape(-1, 2)[:count]
