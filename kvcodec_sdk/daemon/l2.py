"""The daemon's L2 index: regions, slots, leases, pins and LRU eviction (no I/O).

Every slot is in one state: free; leased (a client writes it; its header's version is odd);
stored (a key names it; its version is even); or retired (replaced or evicted while pinned:
freed once its last pin is released). A stored slot that some client pinned (a ``get`` hit not
yet released) is never evicted nor reused, so a reader's reference stays valid until it releases
it; the version in the header is the reader's proof of that.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .arena import Arena, RegionLayout, key_digest

__all__ = ["L2Index", "Region"]


@dataclass
class Region:
    layout: RegionLayout
    identity: str
    versions: list[int]
    free: list[int]
    keys: dict[bytes, int] = field(default_factory=dict)  # key -> stored slot
    slot_key: dict[int, bytes] = field(default_factory=dict)  # stored slot -> key
    lru: OrderedDict = field(default_factory=OrderedDict)  # stored, unpinned slots, oldest first
    pins: dict[int, int] = field(default_factory=dict)  # slot -> pins held (all clients)
    lengths: dict[int, tuple[int, int]] = field(default_factory=dict)  # stored slot -> (length, crc)
    leased: dict[int, int] = field(default_factory=dict)  # slot -> client id
    retired: set[int] = field(default_factory=set)


@dataclass
class Counters:
    sets: int = 0
    set_bytes: int = 0
    set_refused: int = 0
    gets: int = 0
    hits: int = 0
    misses: int = 0
    hit_bytes: int = 0
    evictions: int = 0
    ephemeral: int = 0
    leases: int = 0
    aborted: int = 0
    reclaimed_pins: int = 0
    reclaimed_leases: int = 0


class L2Index:
    """Regions cut from an :class:`Arena` on demand, first come, until it is full."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.regions: list[Region] = []
        self.by_identity: dict[tuple[str, int], int] = {}
        self.next_offset = 0
        self.counters = Counters()
        # client id -> region id -> slot -> pins held by that client
        self.client_pins: dict[int, dict[int, dict[int, int]]] = {}

    # -- regions ---------------------------------------------------------------------------------

    def region(self, identity: str, page_bytes: int, slots: int) -> Region:
        """The region of (identity, page bytes), created with up to ``slots`` slots (what is left of
        the arena, at least one) the first time it is asked for."""
        if page_bytes <= 0 or slots <= 0:
            raise ValueError(f"page bytes {page_bytes} and slots {slots} must be positive")
        found = self.by_identity.get((identity, page_bytes))
        if found is not None:
            return self.regions[found]
        room = self.arena.size - self.next_offset
        fit = max(0, min(slots, (room - 4096) // (-(-page_bytes // 4096) * 4096 + 64)))
        while fit > 0 and RegionLayout.bytes_for(page_bytes, fit) > room:
            fit -= 1
        if fit <= 0:
            raise ValueError(f"the arena has {room} bytes left, not enough for one slot of {page_bytes} bytes "
                             f"(start the daemon with a larger --l2-bytes)")
        table = self.next_offset
        data = table + -(-fit * 64 // 4096) * 4096
        layout = RegionLayout(len(self.regions), table, data, -(-page_bytes // 4096) * 4096, fit, page_bytes)
        self.next_offset = layout.end
        region = Region(layout, identity, [0] * fit, list(range(fit - 1, -1, -1)))
        for s in range(fit):
            self.arena.write_header(layout, s, 0)
        self.regions.append(region)
        self.by_identity[(identity, page_bytes)] = layout.region
        return region

    def get_region(self, region_id: int) -> Region:
        if not 0 <= region_id < len(self.regions):
            raise ValueError(f"region {region_id} does not exist (ask for it with 'region' first)")
        return self.regions[region_id]

    # -- writes ----------------------------------------------------------------------------------

    def lease(self, client: int, region_id: int, count: int) -> tuple[list[int], list[int]]:
        """Up to ``count`` slots for ``client`` to write, evicting least recently used stored slots
        that nobody pinned: (slots, their odd versions)."""
        r = self.get_region(region_id)
        slots: list[int] = []
        while len(slots) < count:
            if not r.free and not self._evict_one(r):
                break
            s = r.free.pop()
            r.versions[s] += 1  # odd: being written
            self.arena.write_header(r.layout, s, r.versions[s])
            r.leased[s] = client
            slots.append(s)
        self.counters.leases += len(slots)
        return slots, [r.versions[s] for s in slots]

    def commit(self, client: int, region_id: int, slots: list[int], keys: list[bytes], lengths: list[int],
               crcs: list[int], ephemeral: bool) -> list[int]:
        """Stores each leased slot under its key (status 0), or frees it (1: not this client's lease;
        2: a bad length)."""
        r = self.get_region(region_id)
        out = []
        for s, key, n, crc in zip(slots, keys, lengths, crcs):
            if r.leased.get(s) != client:
                out.append(1)
                continue
            del r.leased[s]
            if not 0 <= n <= r.layout.page_bytes:
                self._free(r, s)
                out.append(2)
                continue
            old = r.keys.get(key)
            if old is not None:
                self._unstore(r, old)
            r.versions[s] += 1  # even: stable
            self.arena.write_header(r.layout, s, r.versions[s], n, crc, key_digest(key))
            r.keys[key] = s
            r.slot_key[s] = key
            r.lengths[s] = (n, crc)
            r.lru[s] = True
            self.counters.sets += 1
            self.counters.set_bytes += n
            self.counters.ephemeral += int(ephemeral)
            out.append(0)
        return out

    def abort(self, client: int, region_id: int, slots: list[int]) -> None:
        """Frees slots leased to ``client`` that it will not commit."""
        r = self.get_region(region_id)
        for s in slots:
            if r.leased.get(s) == client:
                del r.leased[s]
                self._free(r, s)
                self.counters.aborted += 1

    # -- reads -----------------------------------------------------------------------------------

    def get(self, client: int, region_id: int, keys: list[bytes]) -> list[list[int] | None]:
        """Per key ``[slot, version, length, crc]`` (the slot pinned for ``client``) or None."""
        r = self.get_region(region_id)
        pins = self.client_pins.setdefault(client, {}).setdefault(region_id, {})
        lookup, lru_pop, region_pins, versions, lengths = r.keys.get, r.lru.pop, r.pins, r.versions, r.lengths
        out: list[list[int] | None] = []
        hits = hit_bytes = 0
        for key in keys:
            s = lookup(key)
            if s is None:
                out.append(None)
                continue
            lru_pop(s, None)  # pinned: not evictable
            region_pins[s] = region_pins.get(s, 0) + 1
            pins[s] = pins.get(s, 0) + 1
            n, crc = lengths[s]
            out.append([s, versions[s], n, crc])
            hits += 1
            hit_bytes += n
        c = self.counters
        c.gets += len(keys)
        c.hits += hits
        c.misses += len(keys) - hits
        c.hit_bytes += hit_bytes
        return out

    def release(self, client: int, region_id: int, slots: list[int]) -> None:
        """Drops one pin of ``client`` per slot (unknown ones are ignored)."""
        r = self.get_region(region_id)
        pins = self.client_pins.get(client, {}).get(region_id, {})
        for s in slots:
            if pins.get(s, 0) <= 0:
                continue
            pins[s] -= 1
            if not pins[s]:
                del pins[s]
            self._unpin(r, s)

    def drop_client(self, client: int) -> None:
        """A client went away (closed or killed): its pins are released and its leases freed."""
        for region_id, pins in self.client_pins.pop(client, {}).items():
            r = self.regions[region_id]
            for s, n in pins.items():
                for _ in range(n):
                    self._unpin(r, s)
                self.counters.reclaimed_pins += n
        for r in self.regions:
            mine = [s for s, c in r.leased.items() if c == client]
            for s in mine:
                del r.leased[s]
                self._free(r, s)
            self.counters.reclaimed_leases += len(mine)

    # -- internals -------------------------------------------------------------------------------

    def _unpin(self, r: Region, s: int) -> None:
        r.pins[s] -= 1
        if r.pins[s]:
            return
        del r.pins[s]
        if s in r.retired:
            r.retired.discard(s)
            self._free(r, s)
        elif s in r.slot_key:
            r.lru[s] = True  # most recently used

    def _unstore(self, r: Region, s: int) -> None:
        """The key of stored slot ``s`` goes; the slot is freed now, or at its last unpin."""
        key = r.slot_key.pop(s)
        r.keys.pop(key, None)
        r.lengths.pop(s, None)
        r.lru.pop(s, None)
        if r.pins.get(s):
            r.retired.add(s)
        else:
            self._free(r, s)

    def _evict_one(self, r: Region) -> bool:
        if not r.lru:
            return False
        s, _ = r.lru.popitem(last=False)
        self._unstore(r, s)
        self.counters.evictions += 1
        return True

    def _free(self, r: Region, s: int) -> None:
        r.versions[s] += 1 if r.versions[s] % 2 else 2  # even, and never a version a reader holds
        self.arena.write_header(r.layout, s, r.versions[s])
        r.free.append(s)

    def stats(self) -> dict:
        c = self.counters
        out = {k: getattr(c, k) for k in c.__dataclass_fields__}
        out.update(regions=len(self.regions), arena_bytes=self.arena.size, arena_used=self.next_offset,
                   hugepages=self.arena.hugepages,
                   slots=sum(r.layout.slots for r in self.regions),
                   slots_free=sum(len(r.free) for r in self.regions),
                   slots_stored=sum(len(r.keys) for r in self.regions),
                   slots_leased=sum(len(r.leased) for r in self.regions),
                   slots_pinned=sum(len(r.pins) for r in self.regions))
        return out
