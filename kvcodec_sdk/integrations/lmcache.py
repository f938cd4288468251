"""kvcodec codecs as LMCache v1 serdes: ``"serde": {"type": "kvcodec-fp8"}`` in an L2 adapter.

LMCache's distributed (multiprocess) storage runs a *serde* between its L1 memory objects and an
L2 adapter: ``register_serde_factory(name, factory)`` names a factory that returns an
``AsyncSerdeProcessor(serializer, deserializer, max_workers)``. :func:`register` adds one
kvcodec codec under a name, :func:`register_all` adds every registered codec that has a CPU
implementation as ``kvcodec-<codec>``. Call either in the process that runs LMCache's storage
manager before it reads its configuration.

Built and tested against LMCache :data:`LMCACHE_VERSION` (its serde API is young; another version
may differ). The codec runs on its host (CPU reference) backend over memory objects in host
memory, which is where LMCache's L1 keeps them.

**How a memory object becomes a hot page.** A memory object holds one or more groups (shape,
dtype) back to back. Each group of shape ``[2, L, T, D]`` (K and V planes, ``L`` layers, ``T``
tokens, hidden size ``D``) becomes ``2 L`` buffers, K then V, of ``T`` tokens × ``num_heads``
heads × ``D / num_heads`` elements (``num_heads`` from the serde configuration, 1 when not given),
layer ids numbered across the object's groups. A group ``[L, T, D]`` (one plane, e.g. MLA)
becomes ``L`` buffers of role *other*, and any other group one opaque buffer: both are stored
losslessly by every codec. The object is copied into one slot of a host pool of one pool (the
codec is configured once per layout, and LMCache's objects have no fixed addresses), encoded
into the serde's output and decoded back through the same slot.

**The stored object.** A 32-byte frame, then the codec's blob. The frame (little-endian): magic
``"KVSD"``, frame version, frame size, an identity hash (codec name, format version, the
parameters that shape the blob, the layout), the blob's stored size, the CRC-32C of the blob and
the CRC-32C of the frame's first 28 bytes. Codecs with the cold-page envelope store only the
envelope's header and payload, so compression shrinks what the L2 adapter keeps; fixed-size
codecs store their whole cold page. Deserialize refuses (raises :class:`SerdeDropError`) a
frame that is damaged, belongs to another codec, parameter set or layout, fails its checksum, or
whose envelope says the page did not fit: LMCache then reports the load as failed, a miss, and
the engine recomputes instead of using wrong KV. A page that does not fit its cold page fails
serialize, so it is never stored.
"""

from __future__ import annotations

import hashlib
import json
import math
import queue
import struct
import threading
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np

from .. import _native
from ..disk import CodecIdentity, crc32c
from ..errors import KvcodecError
from ..layout import BufferDesc, BufferRole, DataType, LifeCycleDesc, PageStatus, PoolDesc, PoolGroupDesc
from ..registry import CodecRegistry, default_registry
from . import LMCACHE_VERSION

try:
    from lmcache.v1.distributed.serde import AsyncSerdeProcessor, Deserializer, Serializer
    from lmcache.v1.distributed.serde.factory import get_registered_serde_types, register_serde_factory
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"kvcodec_sdk.integrations.lmcache needs LMCache {LMCACHE_VERSION} (pip install "
        f"'lmcache=={LMCACHE_VERSION}', or the SDK's 'engines' extra): {_exc}"
    ) from _exc

__all__ = [
    "LMCACHE_VERSION",
    "PREFIX",
    "FRAME_BYTES",
    "SerdeDropError",
    "KvcodecSerializer",
    "KvcodecDeserializer",
    "buffers_of_layout",
    "make_serde",
    "register",
    "register_all",
]

#: Prefix of the serde names :func:`register_all` gives: ``kvcodec-<codec>``.
PREFIX = "kvcodec-"
#: Bytes of the frame in front of every stored blob.
FRAME_BYTES = 32
FRAME_MAGIC = 0x5344564B  # "KVSD"
FRAME_VERSION = 1
_FRAME = struct.Struct("<IHHQQII")  # magic, version, frame bytes, identity, blob bytes, blob CRC, frame CRC
_ENVELOPE = struct.Struct("<IHHIIQII")  # ColdPageEnvelope (kvcodec/codec.h)
_HOT_ALIGN = 256

# torch dtype names (str(dtype)) -> kvcodec DataType.
_DTYPES = {
    "torch.float16": DataType.FLOAT16,
    "torch.bfloat16": DataType.BFLOAT16,
    "torch.float32": DataType.FLOAT32,
    "torch.uint8": DataType.UINT8,
    "torch.int8": DataType.INT8,
    "torch.float8_e4m3fn": DataType.FLOAT8_E4M3,
    "torch.float8_e5m2": DataType.FLOAT8_E5M2,
    "torch.int32": DataType.INT32,
}

# Keys of the "serde" configuration besides "type".
_CONFIG_KEYS = {
    "codec_params": "codec parameters (a mapping), over those given to register()",
    "num_heads": "heads per K/V plane of a [2, L, T, D] group (an integer >= 0; 0 = one head of D)",
    "max_workers": "worker threads of LMCache's AsyncSerdeProcessor (an integer >= 1)",
    "max_layouts": "layouts (shapes and dtypes) kept configured at once (an integer >= 1)",
}

# name -> (codec, params) of every serde this module registered, so a repeated register() is a no-op.
_registered: dict[str, tuple[str, str]] = {}
_registered_lock = threading.Lock()


class SerdeDropError(KvcodecError, RuntimeError):
    """A stored object cannot be decoded (damaged, foreign, did not fit) or a page cannot be stored.

    Raised inside LMCache's serde worker, which reports the task as failed: a failed load is a
    miss for LMCache, a failed store leaves the chunk out of the L2 adapter.
    """


# -- layouts ------------------------------------------------------------------------------------


def _layout_lists(layout: Any) -> tuple[list[tuple[int, ...]], list[Any]]:
    """(shapes as int tuples, dtypes) of a MemoryLayoutDesc or a (shapes, dtypes) pair."""
    if hasattr(layout, "shapes") and hasattr(layout, "dtypes"):
        shapes, dtypes = layout.shapes, layout.dtypes
    else:
        shapes, dtypes = layout
    shapes = [tuple(int(d) for d in s) for s in shapes]
    dtypes = list(dtypes)
    if len(shapes) != len(dtypes) or not shapes:
        raise ValueError(f"a layout needs one dtype per shape and at least one shape; got {len(shapes)} shapes "
                         f"and {len(dtypes)} dtypes")
    return shapes, dtypes


def _itemsize(dtype: Any, group: int) -> int:
    size = getattr(dtype, "itemsize", None)
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"layout group {group}: dtype {dtype!r} has no element size (itemsize)")
    return size


def buffers_of_layout(layout: Any, num_heads: int = 0) -> tuple[list[BufferDesc], int]:
    """The hot buffers of one LMCache memory object and its size in bytes.

    :param layout: an LMCache ``MemoryLayoutDesc`` (``shapes``, ``dtypes``) or a
        ``(shapes, dtypes)`` pair; groups lie back to back, as in LMCache's memory objects.
    :param num_heads: heads per K/V plane of ``[2, L, T, D]`` groups (``D`` must be a multiple);
        0 describes each token of a plane as one head of ``D`` elements.
    :returns: ``(buffers, nbytes)``: the :class:`~kvcodec_sdk.layout.BufferDesc` list of
        pool 0 (K and V of every layer of ``[2, L, T, D]`` groups with their dtype and shape,
        role *other* for ``[L, T, D]`` groups, one opaque buffer for any other group) and the
        object's bytes.
    """
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 0:
        raise ValueError(f"num_heads is {num_heads!r}; it must be an integer >= 0 (0 = one head per token)")
    shapes, dtypes = _layout_lists(layout)
    buffers: list[BufferDesc] = []
    offset = 0
    layer = 0
    for g, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        item = _itemsize(dtype, g)
        nbytes = math.prod(shape) * item
        if nbytes == 0:
            continue
        kv = _DTYPES.get(str(dtype))
        if kv is not None and len(shape) == 4 and shape[0] == 2:
            _, layers, tokens, hidden = shape
            heads = num_heads or 1
            if hidden % heads:
                raise ValueError(f"num_heads is {num_heads}, but the hidden size {hidden} of layout group {g} "
                                 f"(shape {list(shape)}) is not a multiple of it")
            plane = tokens * hidden * item
            for p, role in enumerate((BufferRole.KEY, BufferRole.VALUE)):
                for li in range(layers):
                    buffers.append(BufferDesc(layer_id=layer + li, role=role, byte_offset=offset + (p * layers + li) * plane,
                                              bytes=plane, dtype=kv, tokens_per_page=tokens, num_heads=heads,
                                              head_dim=hidden // heads))
            layer += layers
        elif kv is not None and len(shape) == 3:
            layers, tokens, hidden = shape
            plane = tokens * hidden * item
            for li in range(layers):
                buffers.append(BufferDesc(layer_id=layer + li, role=BufferRole.OTHER, byte_offset=offset + li * plane,
                                          bytes=plane, dtype=kv, tokens_per_page=tokens, num_heads=1, head_dim=hidden))
            layer += layers
        else:
            buffers.append(BufferDesc(layer_id=layer, role=BufferRole.OTHER, byte_offset=offset, bytes=nbytes,
                                      dtype=kv if kv is not None else DataType.UINT8))
            layer += 1
        offset += nbytes
    if offset == 0:
        raise ValueError(f"layout {[list(s) for s in shapes]} holds no bytes")
    return buffers, offset


def _layout_key(layout: Any) -> tuple:
    shapes, dtypes = _layout_lists(layout)
    return tuple(shapes), tuple(str(d) for d in dtypes)


# -- one configured codec per layout ------------------------------------------------------------


class _Lane:
    """A codec configured on one layout: a host pool of ``slots`` staging slots, one per worker."""

    def __init__(self, registry: CodecRegistry, codec: str, params: Mapping[str, Any], layout: Any, key: tuple,
                 num_heads: int, slots: int):
        self.buffers, self.nbytes = buffers_of_layout(layout, num_heads)
        slot_bytes = -(-self.nbytes // 16) * 16
        self._backing = np.zeros(slots * slot_bytes + _HOT_ALIGN, np.uint8)
        start = (-self._backing.ctypes.data) % _HOT_ALIGN
        self.hot = self._backing[start : start + slots * slot_bytes].reshape(slots, slot_bytes)
        self.codec = registry.create_codec(codec, params, device="cpu")
        try:
            group = PoolGroupDesc(pools=[PoolDesc(int(self.hot.ctypes.data), slot_bytes, slots)],
                                  lifecycles=[LifeCycleDesc(0, self.buffers)])
            self.codec.configure([group])
        except Exception:
            self.codec.close()
            raise
        self.cold_bytes = self.codec.cold_page_bytes(0)
        self.envelope = bool(self.codec.spec.envelope)
        self.format_version = int(self.codec.spec.format_version)
        layout = {"shapes": [list(s) for s in key[0]], "dtypes": list(key[1]), "num_heads": num_heads}
        ident = CodecIdentity.from_codec(self.codec, layout)
        digest = hashlib.sha256(f"{ident.name}/{ident.format_version}/{ident.param_hash}".encode()).digest()
        self.identity = int.from_bytes(digest[:8], "little")
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for s in range(slots):
            self._free.put(s)

    def slot(self) -> int:
        """A free staging slot (blocks while every slot is in use by another worker)."""
        return self._free.get()

    def release(self, slot: int) -> None:
        """Returns a staging slot."""
        self._free.put(slot)


class _Lanes:
    """Lanes by layout, the most recently used ``max_layouts`` kept (a lane in use stays alive)."""

    def __init__(self, registry: CodecRegistry, codec: str, params: Mapping[str, Any], num_heads: int, slots: int,
                 max_layouts: int):
        self._registry, self._codec, self._params = registry, codec, dict(params)
        self._num_heads, self._slots, self._max = num_heads, slots, max_layouts
        self._lanes: OrderedDict[tuple, _Lane] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, layout: Any) -> _Lane:
        key = _layout_key(layout)
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = _Lane(self._registry, self._codec, self._params, layout, key, self._num_heads, self._slots)
                self._lanes[key] = lane
                while len(self._lanes) > self._max:
                    self._lanes.popitem(last=False)
            self._lanes.move_to_end(key)
            return lane


# -- memory objects -----------------------------------------------------------------------------


def _object_layout(obj: Any) -> tuple[list, list]:
    return list(obj.get_shapes()), list(obj.get_dtypes())


def _host_bytes(obj: Any, what: str, writable: bool) -> np.ndarray:
    """The logical bytes of a memory object in host memory, as a uint8 array (no copy)."""
    raw = getattr(obj, "raw_tensor", None)
    device = getattr(raw, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise SerdeDropError(f"{what} is in {device} memory; the kvcodec serde runs the codec's host backend "
                             f"and takes memory objects in host memory")
    view = np.frombuffer(obj.byte_array, dtype=np.uint8)
    if writable and not view.flags.writeable:
        raise SerdeDropError(f"{what} ({type(obj).__name__}) is read-only; the serde writes into it")
    return view


def _pairs(a: int, b: int) -> np.ndarray:
    return np.array([[a, b]], dtype=np.int32)


def _envelope_end(blob: np.ndarray, lane: _Lane) -> int:
    """Bytes of an enveloped blob that matter (header and payload); raises for a page that did not
    fit or a bad envelope."""
    status = int(_native.check_envelope(blob, lane.format_version))
    if status != 0:
        raise SerdeDropError(f"{lane.codec.spec.name}: the encoded page's envelope reads {PageStatus(status).name} "
                             f"(a page that does not fit its {lane.cold_bytes}-byte cold page is not stored)")
    _, _, _, header_bytes, payload_bytes, _, _, _ = _ENVELOPE.unpack_from(blob, 0)
    return min(lane.cold_bytes, header_bytes + payload_bytes)


class KvcodecSerializer(Serializer):
    """LMCache ``Serializer`` that encodes a memory object with a kvcodec codec (see the module)."""

    def __init__(self, lanes: _Lanes):
        self._lanes = lanes

    def estimate_serialized_size(self, layout_desc: Any) -> int:
        """Frame plus the codec's cold page for this layout: an exact upper bound."""
        return FRAME_BYTES + self._lanes.get(layout_desc).cold_bytes

    def serialize(self, src: Any, dst: Any, key: Any) -> int:
        """Encodes ``src`` (KV memory object) into ``dst`` (byte buffer); returns the bytes written.

        ``key`` is not used: the blob depends on the bytes alone.
        """
        lane = self._lanes.get(_object_layout(src))
        hot = _host_bytes(src, "the source memory object", writable=False)
        out = _host_bytes(dst, "the destination buffer", writable=True)
        if hot.size < lane.nbytes:
            raise SerdeDropError(f"the source memory object holds {hot.size} bytes; its layout needs {lane.nbytes}")
        need = FRAME_BYTES + lane.cold_bytes
        if out.size < need:
            raise SerdeDropError(f"the destination buffer holds {out.size} bytes; {lane.codec.spec.name} needs {need} "
                                 f"(estimate_serialized_size)")
        blob = out[FRAME_BYTES:need]
        slot = lane.slot()
        try:
            lane.hot[slot, : lane.nbytes] = hot[: lane.nbytes]
            lane.codec.encode(0, blob, _pairs(0, slot))
        finally:
            lane.release(slot)
        stored = _envelope_end(blob, lane) if lane.envelope else lane.cold_bytes
        header = _FRAME.pack(FRAME_MAGIC, FRAME_VERSION, FRAME_BYTES, lane.identity, stored, crc32c(blob[:stored]), 0)
        crc = crc32c(np.frombuffer(header[:28], np.uint8))
        out[:FRAME_BYTES] = np.frombuffer(header[:28] + struct.pack("<I", crc), np.uint8)
        return FRAME_BYTES + stored


class KvcodecDeserializer(Deserializer):
    """LMCache ``Deserializer`` that checks a stored frame and decodes its blob (see the module)."""

    def __init__(self, lanes: _Lanes):
        self._lanes = lanes

    def deserialize(self, src: Any, dst: Any, key: Any) -> None:
        """Decodes ``src`` (bytes a serialize wrote) into ``dst`` (KV memory object).

        Raises :class:`SerdeDropError` when the frame is damaged or foreign, the blob fails its
        checksum or envelope, or the codec reports the page not OK; LMCache reports a miss.
        """
        lane = self._lanes.get(_object_layout(dst))
        name = lane.codec.spec.name
        data = _host_bytes(src, "the stored buffer", writable=True)
        out = _host_bytes(dst, "the destination memory object", writable=True)
        if data.size < FRAME_BYTES:
            raise SerdeDropError(f"the stored buffer holds {data.size} bytes, fewer than the {FRAME_BYTES}-byte frame")
        magic, version, frame_bytes, identity, stored, blob_crc, frame_crc = _FRAME.unpack_from(data, 0)
        if magic != FRAME_MAGIC:
            raise SerdeDropError(f"the stored buffer starts with {magic:#010x}, not the kvcodec frame magic "
                                 f"{FRAME_MAGIC:#010x}")
        if crc32c(data[:28]) != frame_crc:
            raise SerdeDropError("the kvcodec frame fails its CRC-32C")
        if version != FRAME_VERSION or frame_bytes != FRAME_BYTES:
            raise SerdeDropError(f"the kvcodec frame has version {version} and {frame_bytes} bytes; this SDK reads "
                                 f"version {FRAME_VERSION} of {FRAME_BYTES} bytes")
        if identity != lane.identity:
            raise SerdeDropError(f"the stored blob was written by another codec, parameter set or layout than "
                                 f"{name!r} with layout {_layout_key(_object_layout(dst))}")
        if stored > lane.cold_bytes or (not lane.envelope and stored != lane.cold_bytes):
            raise SerdeDropError(f"the frame says {stored} blob bytes; {name} blobs of this layout have "
                                 f"{lane.cold_bytes}")
        if data.size < FRAME_BYTES + stored:
            raise SerdeDropError(f"the stored buffer holds {data.size} bytes; its frame says {FRAME_BYTES + stored}")
        if out.size < lane.nbytes:
            raise SerdeDropError(f"the destination memory object holds {out.size} bytes; its layout needs "
                                 f"{lane.nbytes}")
        if crc32c(data[FRAME_BYTES : FRAME_BYTES + stored]) != blob_crc:
            raise SerdeDropError(f"the {name} blob fails its CRC-32C")
        if data.size >= FRAME_BYTES + lane.cold_bytes:
            blob = data[FRAME_BYTES : FRAME_BYTES + lane.cold_bytes]
        else:
            blob = np.zeros(lane.cold_bytes, np.uint8)
            blob[:stored] = data[FRAME_BYTES : FRAME_BYTES + stored]
        blob[stored:] = 0  # past an envelope's payload: bytes no decode reads, zeroed all the same
        if lane.envelope:
            _envelope_end(blob[:stored], lane)
        slot = lane.slot()
        try:
            if lane.codec.has_checked_decode:
                status = np.full(1, 255, np.uint8)
                lane.codec.decode_checked(0, blob, _pairs(slot, 0), status)
                if status[0] != PageStatus.OK:
                    raise SerdeDropError(f"{name}: the page decodes with status {PageStatus(int(status[0])).name}")
            else:
                lane.codec.decode(0, blob, _pairs(slot, 0))
            out[: lane.nbytes] = lane.hot[slot, : lane.nbytes]
        finally:
            lane.release(slot)


# -- LMCache's registry -------------------------------------------------------------------------


def _int_option(config: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"kvcodec serde option {key!r} is {value!r}; it must be an integer >= {minimum}")
    return value


def make_serde(codec: str, config: Mapping[str, Any] | None = None, *, params: Mapping[str, Any] | None = None,
               registry: CodecRegistry | None = None) -> AsyncSerdeProcessor:
    """An LMCache ``AsyncSerdeProcessor`` running ``codec`` (what a registered factory returns).

    :param codec: a registered codec name with a CPU implementation.
    :param config: the ``"serde"`` configuration less ``"type"``: ``codec_params``, ``num_heads``,
        ``max_workers``, ``max_layouts`` (see docs/engines.md).
    :param params: codec parameters under ``config["codec_params"]``.
    :param registry: the codec registry (default: the process-wide one).
    """
    config = dict(config or {})
    unknown = sorted(set(config) - set(_CONFIG_KEYS))
    if unknown:
        valid = "; ".join(f"{k!r}: {v}" for k, v in _CONFIG_KEYS.items())
        raise ValueError(f"kvcodec serde for codec {codec!r} has no option {unknown[0]!r}; valid options: {valid}")
    extra = config.get("codec_params", {})
    if not isinstance(extra, Mapping):
        raise ValueError(f"kvcodec serde option 'codec_params' is {extra!r}; it must be a mapping of codec "
                         f"parameter names to values")
    num_heads = _int_option(config, "num_heads", 0, 0)
    workers = _int_option(config, "max_workers", 1, 1)
    max_layouts = _int_option(config, "max_layouts", 8, 1)
    reg = registry or default_registry()
    spec = reg.get_codec_spec(codec)
    if "cpu" not in spec.devices:
        raise ValueError(f"codec {codec!r} has no CPU implementation (it runs on: {', '.join(spec.devices)}); the "
                         f"kvcodec serde runs codecs on the host")
    full = spec.validate_params({**dict(params or {}), **dict(extra)})
    lanes = _Lanes(reg, codec, full, num_heads, workers, max_layouts)
    return AsyncSerdeProcessor(KvcodecSerializer(lanes), KvcodecDeserializer(lanes), max_workers=workers)


def register(name: str, *, codec: str | None = None, params: Mapping[str, Any] | None = None,
             registry: CodecRegistry | None = None) -> str:
    """Registers a kvcodec codec as the LMCache serde type ``name``; returns ``name``.

    :param name: the serde type of LMCache's configuration, ``"kvcodec-<codec>"`` unless ``codec``
        is given.
    :param codec: the codec's registry name (default: ``name`` less the ``kvcodec-`` prefix).
    :param params: codec parameters of this serde type (a configuration's ``codec_params`` override them).
    :param registry: the codec registry (default: the process-wide one).

    Registering the same name with the same codec and parameters again does nothing; any other
    name LMCache already knows is an error.
    """
    if codec is None:
        if not isinstance(name, str) or not name.startswith(PREFIX) or len(name) == len(PREFIX):
            raise ValueError(f"serde name {name!r} does not start with {PREFIX!r} followed by a codec name; "
                             f"pass codec= to name the codec")
        codec = name[len(PREFIX):]
    reg = registry or default_registry()
    spec = reg.get_codec_spec(codec)
    if "cpu" not in spec.devices:
        raise ValueError(f"codec {codec!r} has no CPU implementation (it runs on: {', '.join(spec.devices)}); the "
                         f"kvcodec serde runs codecs on the host")
    fixed = spec.validate_params(params)
    signature = (codec, json.dumps(fixed, sort_keys=True))
    with _registered_lock:
        if name in _registered:
            if _registered[name] != signature:
                raise ValueError(f"LMCache serde {name!r} is already registered for codec {_registered[name][0]!r} "
                                 f"with parameters {_registered[name][1]}")
            return name
        if name in get_registered_serde_types():
            raise ValueError(f"LMCache already has a serde named {name!r}; choose another name")

        def factory(config: dict) -> AsyncSerdeProcessor:
            return make_serde(codec, config, params=fixed, registry=reg)

        register_serde_factory(name, factory)
        _registered[name] = signature
    return name


def register_all(prefix: str = PREFIX, *, registry: CodecRegistry | None = None) -> list[str]:
    """Registers every registered codec with a CPU implementation as ``<prefix><codec>``.

    :returns: the serde names, sorted (codecs that run only on CUDA are left out).
    """
    reg = registry or default_registry()
    return [register(f"{prefix}{spec.name}", codec=spec.name, registry=reg)
            for spec in reg.list_codecs() if "cpu" in spec.devices]

