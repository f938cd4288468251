"""The per-host cache daemon's L2 arena as a remote-tier backend: cold pages shared by every
process on the host, through the manager's remote level.

A manager configured with ``RemoteTierConfig(lambda identity: DaemonBackend(socket, identity))``
evicts pages into the daemon's shared arena and onboards them from it, with the remote level's
rules (nothing committed on failure, misses and foreign or damaged values dropped, off the
caller's thread, ``find_remote`` for prefix lookup). Another process on the host with the same
codec and layout finds and onboards them. Page bytes never cross the daemon's socket: a put
writes each value straight into a leased arena slot, a get copies it out of the slot it was
told about (the socket carries keys and slot references; ``DaemonClient.socket_bytes`` counts).

Every value is the remote tier's header (codec identity, key and payload checksums) and the
blob, in one region of the arena whose slots hold ``value_bytes``; the daemon adds its own slot
checks (version, key digest, CRC-32C). Values of several codecs share the region (the header
tells them apart). Eviction is the daemon's (least recently used, never a slot a reader holds);
a daemon restart empties L2, and the backend reconnects at its next call.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..daemon import DaemonClient, DaemonError, DaemonUnavailable, RegionHandle
from ..daemon.client import DEFAULT_BUSY_POLL_US
from .backend import (
    GET_MISS,
    HEADER_BYTES,
    RemoteBackend,
    RemoteError,
    RemoteFull,
    RemoteUnavailable,
    Status,
    byte_view,
)

__all__ = ["DaemonBackend"]

#: The region every DaemonBackend value lives in (one per slot size).
REGION_NAME = "kvcodec-remote-values"


class DaemonBackend(RemoteBackend):
    """The daemon at ``socket_path`` as a remote store.

    :param identity: The codec identity written into and required of every value.
    :param value_bytes: Bytes per arena slot: the largest value (header and blob) this backend
        stores, rounded up to 4 KiB. None sizes it by the first call's values (a manager's are all
        one size: its cold page bytes); every process sharing pages must end up with the same.
    :param slots: Slots asked for when the region is created (the daemon gives what its arena
        has room for; the first process to ask sets the region's size). None asks for half of the
        arena's room that is left, so regions of other value sizes still fit.
    :param timeout_s: Bound of each call to the daemon.
    :param busy_poll_us: How long a call polls for the daemon's reply before sleeping.
    """

    name = "daemon"

    def __init__(self, socket_path: str, identity: Any, timeout_s: float = 5.0, value_bytes: int | None = None,
                 slots: int | None = None, busy_poll_us: float = DEFAULT_BUSY_POLL_US) -> None:
        super().__init__(identity, timeout_s)
        if value_bytes is not None and (not isinstance(value_bytes, int) or isinstance(value_bytes, bool)
                                        or value_bytes <= HEADER_BYTES):
            raise ValueError(f"value_bytes: {value_bytes!r} is not valid: give more than {HEADER_BYTES} bytes, "
                             "or None to size by the first values")
        if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool) or slots <= 0):
            raise ValueError(f"slots: {slots!r} is not valid: give a positive number of slots, or None")
        self.socket_path = socket_path
        self.value_bytes = None if value_bytes is None else -(-value_bytes // 4096) * 4096
        self.slots = slots
        self._poll = busy_poll_us
        self._region: RegionHandle | None = None
        self._closed = False
        try:
            self._client: DaemonClient | None = DaemonClient(socket_path, timeout_s, busy_poll_us)
        except DaemonError as e:
            raise self._error(RemoteUnavailable, "connect", e) from None

    @property
    def address(self) -> str:
        return self.socket_path

    # -- connection --------------------------------------------------------------------------

    def _connected(self, op: str) -> DaemonClient:
        """The client, reconnected if the daemon went away since the last call."""
        if self._closed:
            raise self._error(RemoteUnavailable, op, "the backend is closed")
        if self._client is None:
            try:
                self._client = DaemonClient(self.socket_path, self.timeout_s, self._poll)
            except DaemonError as e:
                raise self._error(RemoteUnavailable, op, e) from None
            self._region = None  # a restarted daemon has new regions
        return self._client

    def _call(self, op: str, fn):
        """``fn(client)``; a daemon that went away is RemoteUnavailable (the next call reconnects)."""
        client = self._connected(op)
        try:
            return fn(client)
        except DaemonUnavailable as e:
            client.close()
            self._client, self._region = None, None
            raise self._error(RemoteUnavailable, op, e) from None
        except DaemonError as e:
            raise self._error(RemoteError, op, e) from None

    def _region_for(self, client: DaemonClient, size: int | None) -> RegionHandle | None:
        """The values' region; with ``value_bytes`` still unknown, one sized for ``size`` (a put's
        largest value) or, for reads (``size`` None), the one a writer created, or None (nothing
        was stored yet)."""
        if self._region is None:
            if self.value_bytes is None and size is None:
                self._region = client.find_region(REGION_NAME)
                if self._region is not None:
                    self.value_bytes = self._region.layout.page_bytes
                return self._region
            if self.value_bytes is None:
                self.value_bytes = -(-max(size or 0, HEADER_BYTES + 1) // 4096) * 4096
            slots = self.slots
            if slots is None:  # half of what is left (a region that exists already is returned as it is)
                st = client.stats()
                slots = max(1, (st["arena_bytes"] - st["arena_used"]) // 2 // (self.value_bytes + 64))
            self._region = client.region(REGION_NAME, self.value_bytes, slots)
        return self._region

    # -- the backend interface ---------------------------------------------------------------

    def put_batch(self, keys: Sequence[bytes], values: Sequence[Any]) -> list[Status]:
        keys = self._check_keys(keys, values, "values")
        payloads = [byte_view(v, f"values[{i}]") for i, v in enumerate(values)]
        if not keys:
            return []

        def put(client: DaemonClient) -> list[Status]:
            region = self._region_for(client, HEADER_BYTES + max(p.nbytes for p in payloads))
            assert region is not None
            # Natively: each value's header written and its payload copied and checksummed in one
            # pass, straight into a leased slot (0 stored, 1 no unpinned slot, 2 over value_bytes).
            codes = client._native.put_values(region.layout, keys, payloads, self.identity)
            return [(Status.OK, Status.FULL, Status.ERROR)[c] for c in codes]

        statuses = self._count_puts(self._call("put_batch", put), [p.nbytes for p in payloads])
        if Status.FULL in statuses:
            raise RemoteFull(self.name, self.address, "put_batch",
                             "every L2 slot of the region is pinned by readers or being written", statuses)
        return statuses

    def get_batch(self, keys: Sequence[bytes], out_buffers: Sequence[Any]) -> list[int]:
        keys = self._check_keys(keys, out_buffers, "out_buffers")
        outs = [byte_view(b, f"out_buffers[{i}]", writable=True) for i, b in enumerate(out_buffers)]
        if not keys:
            return []

        def get(client: DaemonClient) -> list[int]:
            region = self._region_for(client, None)
            if region is None:
                return [GET_MISS] * len(keys)
            # Natively: one lookup, each value's header checked, its payload copied and
            # checksummed in one pass, the slot confirmed unchanged, every pin released.
            return client._native.get_values(region.layout, keys, outs, self.identity)

        return [self._count_get(c) for c in self._call("get_batch", get)]

    def exists_batch(self, keys: Sequence[bytes]) -> list[bool]:
        keys = self._check_keys(keys)
        if not keys:
            return []

        def exists(client: DaemonClient) -> list[bool]:
            region = self._region_for(client, None)
            if region is None:
                return [False] * len(keys)
            found = client.lookup(region, keys)
            client.release(region, found)
            return found.found.tolist()

        return self._call("exists_batch", exists)

    def remove_batch(self, keys: Sequence[bytes]) -> list[bool]:
        keys = self._check_keys(keys)
        if not keys:
            return []
        def remove(client: DaemonClient) -> list[bool]:
            region = self._region_for(client, None)
            return [False] * len(keys) if region is None else client.erase(region, keys)

        return self._call("remove_batch", remove)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._closed = True

