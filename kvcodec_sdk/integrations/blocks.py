"""An engine's KV blocks encoded into host blob slots with a codec, and decoded back.

:class:`BlockCodecStore` is the engine-neutral core of an offloading worker: the engine owns
its KV tensors (one per layer, leading dimension the block), :func:`kvcodec_sdk.kv_tensors.kv_pool_group`
turns them into the codec's hot pool group (block ``b`` of every layer is hot slot ``b``), and
the store keeps ``num_slots`` host blob slots of ``cold_page_bytes`` each. :meth:`~BlockCodecStore.store`
encodes blocks straight from the engine's tensors into slots, :meth:`~BlockCodecStore.load` decodes
slots straight back into blocks; both return at once on CUDA (the codec call runs on the store's
own stream, ordered after the engine's current stream) and :meth:`~BlockCodecStore.poll` reports
the jobs that completed. The vLLM offloading worker (``kvcodec_sdk.integrations.vllm``) is
this store behind vLLM's interface; another engine wraps it the same way.

**Drops are misses.** A block whose page did not fit its cold page (an ``nvcomp-*`` codec with
``slot_ratio`` below 1) is not stored; a slot whose blob fails the codec's checks when loaded
fails the load of its block. Both slots are reported by :meth:`~BlockCodecStore.take_bad_slots`
so the engine forgets them, and failed loads are either failed jobs or, with
``report_load_errors``, successful jobs whose blocks :meth:`~BlockCodecStore.take_load_errors`
returns (for an engine that recomputes them).

Needs torch (the engine's tensors, pinned host memory, CUDA streams and events). A store is
driven by one thread, as an engine's offloading worker is: calls from several threads at once
must be serialized by the caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _native
from ..codec import Codec
from ..layout import PageIndexLocation, PageStatus, PoolGroupDesc
from ..registry import create_codec

__all__ = ["BlockCodecStore", "BlockJob", "BlockResult"]

# The cold-page envelope's first 8 bytes (kvcodec/codec.h): magic (u32), format version (u16),
# flags (u16), of which bit 2 says the page did not fit its slot.
_ENVELOPE_HEAD, _ENVELOPE_MAGIC, _DID_NOT_FIT = 8, 0x5043564B, 1 << 2


@dataclass
class BlockJob:
    """One submitted store or load (what :meth:`BlockCodecStore.poll` finishes)."""

    job_id: int
    load: bool  #: True for a load (slots -> blocks), False for a store
    slots: np.ndarray  #: host slots, one per block
    blocks: np.ndarray  #: the engine's block indices
    started: float  #: ``time.perf_counter()`` at submission
    event: Any = None  #: CUDA: recorded on the store's stream after the job's codec call
    status: Any = None  #: checked decode: one status byte per page
    failed: list | None = None  #: (block, slot) of loads known bad before the job ran
    order: int = 0  #: submission order (results are reported in it)


@dataclass(frozen=True)
class BlockResult:
    """A finished job: ``ok`` is False only for a failed load without ``report_load_errors``."""

    job_id: int
    ok: bool
    nbytes: int  #: the engine's bytes of the job's blocks (raw page bytes per block)
    seconds: float  #: from submission to the poll that found it done


class BlockCodecStore:
    """Encodes an engine's KV blocks into host blob slots and decodes them back.

    :param tensors: the engine's KV tensors of one cache group, one per layer, each with the
        block as its leading dimension (e.g. ``(num_blocks, page_bytes)`` int8 views), on one
        device; the codec reads and writes them in place.
    :param pool_group: their hot pool group (:func:`kvcodec_sdk.kv_tensors.kv_pool_group`).
    :param codec: a registered codec's name; ``params`` its parameters.
    :param num_slots: host blob slots (pinned host memory on CUDA).
    :param report_load_errors: report failed loads as successful jobs whose blocks
        :meth:`take_load_errors` returns; otherwise a failed load fails its job.
    """

    def __init__(self, tensors: list[Any], pool_group: PoolGroupDesc, codec: str, params: dict, num_slots: int,
                 report_load_errors: bool = False):
        if not tensors:
            raise ValueError("tensors is empty; pass the KV tensor of every layer of the group")
        if num_slots < 1:
            raise ValueError(f"num_slots is {num_slots}; the host tier needs at least one slot")
        self.device = tensors[0].device
        if any(t.device != self.device for t in tensors):
            raise ValueError(f"the KV tensors are on {sorted({str(t.device) for t in tensors})}; one device only")
        self.cuda = self.device.type == "cuda"
        label = f"cuda:{self.device.index or 0}" if self.cuda else "cpu"
        self.tensors = tensors  #: the engine's tensors, the codec's hot pools
        self.pool_group = pool_group
        self.codec: Codec = create_codec(codec, params, device=label)
        self.codec.configure([self.pool_group])
        self.cold_page_bytes = self.codec.cold_page_bytes(0)  #: bytes of one host slot
        self.envelope = bool(self.codec.spec.envelope)
        self.format_version = int(self.codec.spec.format_version)
        self.checked = self.codec.has_checked_decode
        self._device_indices = self.codec.page_index_location(0) == PageIndexLocation.DEVICE
        self.raw_page_bytes = sum(int(t.stride(0)) * t.element_size() for t in tensors)  #: one block, all layers
        #: The host tier: one blob of ``cold_page_bytes`` per slot.
        self.host = torch.zeros((num_slots, self.cold_page_bytes), dtype=torch.uint8, pin_memory=self.cuda)
        self._host_np = None if self.cuda else self.host.numpy()
        #: Slots whose blob holds a page (False: never stored, or the page did not fit).
        self.valid = np.zeros(num_slots, dtype=bool)
        self.report_load_errors = report_load_errors
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._jobs: list[BlockJob] = []
        self._ready: list[tuple[int, BlockResult]] = []  # (order, result): a load waited for their store
        self._submitted = 0
        self._load_errors: set[int] = set()
        self._bad_slots: set[int] = set()
        #: Blocks stored and loaded, stores dropped (did not fit) and loads failed, since creation.
        self.counters = {"stored": 0, "loaded": 0, "store_dropped": 0, "load_failed": 0}

    def _pairs(self, dst: np.ndarray, src: np.ndarray) -> Any:
        """The codec's (dst, src) int32 index pairs, where it takes them: host memory, or device
        memory copied on the store's stream (the codec keeps the tensor alive until it ran)."""
        pairs = np.ascontiguousarray(np.stack([dst, src], axis=1), dtype=np.int32)
        if self._device_indices:
            with torch.cuda.stream(self._stream):
                return torch.from_numpy(pairs).pin_memory().to(self.device, non_blocking=True)
        return pairs

    def _blob_ok(self, slot: int) -> int:
        """The envelope status of a host blob (0 for a codec without the envelope)."""
        if not self.envelope:
            return 0
        return int(_native.check_envelope(self.host[slot].numpy(), self.format_version))

    def _next_order(self) -> int:
        self._submitted += 1
        return self._submitted

    def _stored(self, slots: np.ndarray) -> np.ndarray:
        """Which of the just-encoded slots hold their page: for an enveloped codec, those whose
        envelope has the magic and no did-not-fit flag (read from the headers at once; the full
        check, checksums included, runs when a slot is loaded)."""
        if not self.envelope or not len(slots):
            return np.ones(len(slots), dtype=bool)
        head = self.host[torch.from_numpy(slots), :_ENVELOPE_HEAD].numpy()
        magic = head[:, 0:4].copy().view("<u4")[:, 0]
        flags = head[:, 6:8].copy().view("<u2")[:, 0]
        return (magic == _ENVELOPE_MAGIC) & (flags & _DID_NOT_FIT == 0)

    def _ids(self, what: str, blocks: Any, slots: Any) -> tuple[np.ndarray, np.ndarray]:
        """``blocks`` and ``slots`` as int64 arrays, one slot per block, each in range."""
        blocks, slots = np.asarray(blocks, dtype=np.int64), np.asarray(slots, dtype=np.int64)
        if len(blocks) != len(slots):
            first, second = ("blocks", "slots") if what == "store" else ("slots", "blocks")
            n = {"blocks": len(blocks), "slots": len(slots)}
            raise ValueError(f"{what}: {n[first]} {first} for {n[second]} {second}; pass one {second[:-1]} per "
                             f"{first[:-1]}")
        for ids, bound, name in ((slots, len(self.valid), "slot"), (blocks, int(self.tensors[0].shape[0]), "block")):
            if len(ids) and (ids.min() < 0 or ids.max() >= bound):
                bad = int(ids[(ids < 0) | (ids >= bound)][0])
                raise IndexError(f"{what}: {name} {bad} is out of range; valid: 0 .. {bound - 1}")
        return blocks, slots

    def store(self, job_id: int, blocks: Any, slots: Any) -> BlockJob:
        """Encodes ``blocks`` of the engine's tensors into host ``slots`` (CUDA: on the store's
        stream, after the engine's current stream, where the blocks were written)."""
        blocks, slots = self._ids("store", blocks, slots)
        job = BlockJob(job_id, False, slots, blocks, time.perf_counter(), order=self._next_order())
        self.valid[slots] = False
        if len(slots):
            if self.cuda:
                self._stream.wait_stream(torch.cuda.current_stream(self.device))
            pairs = self._pairs(slots, blocks)
            if self.cuda:
                self.codec.encode(0, self.host, pairs, stream=self._stream)
                job.event = torch.cuda.Event()
                job.event.record(self._stream)
            else:
                self.codec.encode(0, self._host_np, pairs)
        self._jobs.append(job)
        return job

    def load(self, job_id: int, slots: Any, blocks: Any) -> BlockJob:
        """Decodes host ``slots`` into the engine's ``blocks`` (CUDA: on the store's stream, after
        the engine's current stream's last reads of the blocks); blocks whose blob is known bad
        are not decoded and fail the load."""
        blocks, slots = self._ids("load", blocks, slots)
        job = BlockJob(job_id, True, slots, blocks, time.perf_counter(), order=self._next_order())
        self._settle_stores(slots)
        good = self.valid[slots].copy()
        if self.envelope and not self.checked:  # checked on the host before decoding
            for i in np.flatnonzero(good):
                good[i] = self._blob_ok(int(slots[i])) == 0
        job.failed = list(zip(blocks[~good].tolist(), slots[~good].tolist()))
        slots, blocks = slots[good], blocks[good]
        job.slots, job.blocks = slots, blocks
        if len(slots):
            if self.cuda:
                self._stream.wait_stream(torch.cuda.current_stream(self.device))
            pairs = self._pairs(blocks, slots)
            if self.cuda:
                if self.checked:
                    job.status = torch.full((len(slots),), 255, dtype=torch.uint8, pin_memory=True)
                    self.codec.decode_checked(0, self.host, pairs, job.status, stream=self._stream)
                else:
                    self.codec.decode(0, self.host, pairs, stream=self._stream)
                job.event = torch.cuda.Event()
                job.event.record(self._stream)
            elif self.checked:
                job.status = np.full(len(slots), 255, dtype=np.uint8)
                self.codec.decode_checked(0, self._host_np, pairs, job.status)
            else:
                self.codec.decode(0, self._host_np, pairs)
        self._jobs.append(job)
        return job

    def _finish(self, job: BlockJob) -> BlockResult:
        ok = True
        failed = list(job.failed or [])  # (block, slot) of each page that cannot be used
        if job.load:
            if job.status is not None:
                status = np.asarray(job.status.numpy() if hasattr(job.status, "numpy") else job.status)
                bad = status != PageStatus.OK
                failed += list(zip(job.blocks[bad].tolist(), job.slots[bad].tolist()))
            self.counters["loaded"] += len(job.blocks) + len(job.failed or []) - len(failed)
            self.counters["load_failed"] += len(failed)
            if failed and self.report_load_errors:
                self._load_errors.update(int(b) for b, _ in failed)
            elif failed:
                ok = False
        else:
            self.valid[job.slots] = self._stored(job.slots)
            bad = ~self.valid[job.slots]
            failed = [(-1, int(s)) for s in job.slots[bad]]
            self.counters["stored"] += len(job.slots) - len(failed)
            self.counters["store_dropped"] += len(failed)
        for _, slot in failed:
            self.valid[slot] = False
            self._bad_slots.add(slot)
        size = (len(job.blocks) + len(job.failed or [])) * self.raw_page_bytes
        return BlockResult(job.job_id, ok, size, time.perf_counter() - job.started)

    def _settle_stores(self, slots: np.ndarray) -> None:
        """Finishes the stores still in flight into any of ``slots`` (waiting for their codec
        calls), so a load right after a store sees whether the page was stored; their results
        wait for the next :meth:`poll`."""
        wanted = set(slots.tolist())
        for job in [j for j in self._jobs if not j.load and wanted.intersection(j.slots.tolist())]:
            if job.event is not None:
                job.event.synchronize()
            self._jobs.remove(job)
            self._ready.append((job.order, self._finish(job)))

    def poll(self) -> list[BlockResult]:
        """Results of the jobs whose codec calls completed (CPU: every submitted job), in
        submission order; never blocks."""
        done, pending = [], []
        for job in self._jobs:
            (pending if job.event is not None and not job.event.query() else done).append(job)
        self._jobs = pending
        results = self._ready + [(job.order, self._finish(job)) for job in done]
        self._ready = []
        return [r for _, r in sorted(results, key=lambda pair: pair[0])]

    def wait(self, job_ids: set[int]) -> None:
        """Blocks until the given jobs' codec calls completed (:meth:`poll` then reports them)."""
        for job in self._jobs:
            if job.job_id in job_ids and job.event is not None:
                job.event.synchronize()

    def take_load_errors(self) -> set[int]:
        """Blocks whose load failed since the last call (with ``report_load_errors``)."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def take_bad_slots(self) -> set[int]:
        """Host slots found unusable since the last call (a page that did not fit, a failed
        load): the engine forgets what it mapped to them."""
        slots, self._bad_slots = self._bad_slots, set()
        return slots

    def close(self) -> None:
        """Waits for every job and releases the codec."""
        if self._stream is not None:
            self._stream.synchronize()
        self.codec.close()
