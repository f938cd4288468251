"""The Python ``Codec``: an owned native codec with consumptive ownership."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from . import _interop
from .errors import CodecCallError, CodecConsumedError
from .layout import PageIndexLocation, PoolGroupDesc, to_native

if TYPE_CHECKING:
    from ._native import NativeCodec
    from .spec import CodecSpec

__all__ = ["Codec"]


class Codec:
    """A native codec owned by Python.

    Created by :func:`kvcodec_sdk.create_codec`. Passing it to ``KVCacheManager`` consumes it,
    whether construction succeeds or fails; so does :meth:`close`. Any later use raises
    :class:`~kvcodec_sdk.errors.CodecConsumedError`.

    Methods mirror ``IKvCacheColdPageCodec``: queries return the contract's values (0, a negative
    ID, ``PageIndexLocation.BAD``) for unknown lifecycles; calls that return false in C++ raise
    :class:`~kvcodec_sdk.errors.CodecCallError` carrying the codec's reason.
    """

    def __init__(self, native: NativeCodec, spec: CodecSpec, params: Mapping[str, Any], device: str):
        self._native: NativeCodec | None = native
        self._consumed_by: str | None = None
        # One call at a time: codecs keep per-call workspaces, and close() must not destroy a
        # codec another thread is calling (native calls release the GIL).
        self._lock = threading.RLock()
        self.spec = spec
        self.params = dict(params)
        self.device = device

    # -- ownership -------------------------------------------------------------------------

    @property
    def consumed(self) -> bool:
        """True once the native codec was handed over or closed."""
        return self._native is None

    def _live(self) -> NativeCodec:
        if self._native is None:
            raise CodecConsumedError(
                f"this {self.spec.name!r} Codec was {self._consumed_by}; it cannot be used again. "
                f"Create a new one with kvcodec_sdk.create_codec({self.spec.name!r}, ...)"
            )
        return self._native

    def _consume(self, by: str = "consumed by a KVCacheManager") -> NativeCodec:
        """Hands the native codec over and invalidates this wrapper (the manager's entry point)."""
        with self._lock:
            native = self._live()
            self._native = None
            self._consumed_by = by
            return native

    def close(self) -> None:
        """Destroys the native codec now (after any call in flight on another thread). Idempotent."""
        with self._lock:
            if self._native is not None:
                self._consume("closed").release()

    def __enter__(self) -> Codec:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"consumed ({self._consumed_by})" if self.consumed else "live"
        return f"<Codec {self.spec.name!r} on {self.device}, {state}>"

    # -- the contract ----------------------------------------------------------------------

    def configure(self, groups: Sequence[PoolGroupDesc]) -> None:
        """Supplies every hot pool group (index = position). Called exactly once."""
        with self._lock:
            self._configure(groups)

    def _configure(self, groups: Sequence[PoolGroupDesc]) -> None:
        native = self._live()
        if not native.configure(to_native(groups)):
            raise CodecCallError(f"{self.spec.name}: configure() rejected the layout: {native.last_error()}")

    def cold_page_bytes(self, lifecycle: int) -> int:
        """Fixed cold-page size of a lifecycle; 0 for an unknown lifecycle."""
        return int(self._live().query_cold_page_bytes(int(lifecycle)))

    def batching_representative(self, lifecycle: int) -> int:
        """Batching representative of a lifecycle (``getBatchingLayerGroupId``); negative for an
        unknown lifecycle."""
        return int(self._live().get_batching_layer_group_id(int(lifecycle)))

    def batching_layer_group_id(self, lifecycle: int) -> int:
        """The former name of :meth:`batching_representative`, after the C++ method."""
        return self.batching_representative(lifecycle)

    def page_index_location(self, lifecycle: int) -> PageIndexLocation:
        """Where the lifecycle's page-index array must live; ``BAD`` for an unknown lifecycle."""
        return PageIndexLocation(self._live().query_page_index_location(int(lifecycle)))

    def encode(self, lifecycle: int, dst_base: Any, page_indices: Any, *, stream: Any = None,
               num_pages: int | None = None) -> None:
        """Enqueues encoding of hot pages into cold blobs at ``dst_base``.

        :param page_indices: int32 pairs (dst cold slot, src hot slot), host or device as
            :meth:`page_index_location` says; or an address with ``num_pages``.
        :param stream: A non-legacy CUDA stream for CUDA codecs; ignored by CPU codecs. torch
            CUDA tensors passed as ``dst_base`` or ``page_indices`` stay allocated until the
            stream reaches this call (``Tensor.record_stream``); memory given by address must be
            kept alive by the caller.
        """
        self._transform("encode", lifecycle, dst_base, page_indices, stream, num_pages)

    def decode(self, lifecycle: int, src_base: Any, page_indices: Any, *, stream: Any = None,
               num_pages: int | None = None) -> None:
        """Enqueues decoding of cold blobs at ``src_base`` into hot pages (pairs: dst hot slot,
        src cold slot)."""
        self._transform("decode", lifecycle, src_base, page_indices, stream, num_pages)

    @property
    def has_checked_decode(self) -> bool:
        """True when the codec reports a status per page (:meth:`decode_checked`, plugin ABI 2)."""
        return bool(self._live().has_checked_decode)

    def decode_checked(self, lifecycle: int, src_base: Any, page_indices: Any, page_status: Any, *,
                       stream: Any = None, num_pages: int | None = None) -> None:
        """:meth:`decode` that writes one :class:`~kvcodec_sdk.layout.PageStatus` byte per page
        into ``page_status`` (a uint8 buffer of at least as many bytes as pages; device or
        mapped pinned memory for a CUDA codec, valid once the stream reaches the call; host
        memory for a CPU codec, valid on return). A bad blob is a status, not an error; pages
        with a non-OK status are not decoded (their hot slots' contents are unspecified).
        Raises ``ValueError`` when the codec has no checked decode (:attr:`has_checked_decode`).
        """
        native = self._live()
        if not native.has_checked_decode:
            raise ValueError(f"codec {self.spec.name!r} has no checked decode (plugin ABI {native.abi_version}); "
                             f"use decode()")
        status_ptr, _ = _interop.writable_pointer(page_status, "page_status")
        self._transform("decode_checked", lifecycle, src_base, page_indices, stream, num_pages,
                        status=(status_ptr, page_status))

    def last_error(self) -> str:
        """The codec's reason for its last failed call."""
        return str(self._live().last_error())

    @staticmethod
    def _check_cold_extent(native, op: str, what: str, lifecycle: int, base: Any, owner: Any, count: int) -> None:
        """Refuses cold indices beyond a sized cold buffer (numpy array or tensor) before the
        codec would write or read past it."""
        nbytes = getattr(base, "nbytes", None)
        if nbytes is None and hasattr(base, "element_size"):
            nbytes = base.numel() * base.element_size()
        page_bytes = native.query_cold_page_bytes(int(lifecycle))
        if nbytes is None or page_bytes == 0:
            return
        pairs = _interop.host_pairs(owner, count)
        column = 0 if op == "encode" else 1  # encode: dst is the cold slot; decode: src is
        highest = int(pairs[:, column].max())
        if (highest + 1) * page_bytes > nbytes:
            raise ValueError(
                f"page_indices reach cold slot {highest}, but {what} holds {nbytes} bytes = "
                f"{nbytes // page_bytes} cold pages of {page_bytes} bytes"
            )

    def _transform(self, op: str, lifecycle: int, base: Any, indices: Any, stream: Any, num_pages: int | None,
                   status: tuple | None = None) -> None:
        with self._lock:
            self._transform_locked(op, lifecycle, base, indices, stream, num_pages, status)

    def _transform_locked(self, op: str, lifecycle: int, base: Any, indices: Any, stream: Any,
                          num_pages: int | None, status: tuple | None) -> None:
        native = self._live()
        what = "dst_base" if op == "encode" else "src_base"
        if op == "encode":
            base_ptr, _ = _interop.writable_pointer(base, what)  # the codec writes the blobs
        else:
            if isinstance(base, np.ndarray) and not base.flags.c_contiguous:
                raise ValueError(f"{what} is not C-contiguous (strides {base.strides}); pass a contiguous array")
            base_ptr, _ = _interop.data_pointer(base, what)
        idx_ptr, count, idx_on_device, owner = _interop.page_indices(indices, num_pages)
        location = PageIndexLocation(native.query_page_index_location(int(lifecycle)))
        if count and idx_on_device is not None and location != PageIndexLocation.BAD:
            wanted_device = location == PageIndexLocation.DEVICE
            if wanted_device != idx_on_device:
                raise ValueError(
                    f"page_indices are in {'device' if idx_on_device else 'host'} memory but lifecycle {lifecycle} "
                    f"of codec {self.spec.name!r} on {self.device} takes {location.name.lower()} indices"
                )
        if count and idx_on_device is False:
            self._check_cold_extent(native, op, what, lifecycle, base, owner, count)
        handle = _interop.stream_handle(stream)
        if status is None:
            ok = getattr(native, op)(int(lifecycle), base_ptr, idx_ptr, count, handle)
            keep = (owner, base)
        else:
            status_ptr, status_obj = status
            nbytes = getattr(status_obj, "nbytes", None)
            if nbytes is None and hasattr(status_obj, "element_size"):
                nbytes = status_obj.numel() * status_obj.element_size()
            if nbytes is not None and nbytes < count:
                raise ValueError(f"page_status holds {nbytes} bytes; it needs one per page ({count})")
            if getattr(status_obj, "flags", None) is not None and not status_obj.flags.writeable:
                raise ValueError("page_status is read-only; the codec writes one status byte per page into it")
            ok = native.decode_checked(int(lifecycle), base_ptr, idx_ptr, count, status_ptr, handle)
            keep = (owner, base, status_obj)
        if ok and count:
            # Queued work reads the indices and the cold buffer after this returns.
            _interop.keep_for_stream(keep, stream, handle)
        del owner  # the index memory had to outlive the native call
        if not ok:
            name = "decodeChecked" if op == "decode_checked" else op
            raise CodecCallError(f"{self.spec.name}: {name}() failed: {native.last_error()}")
