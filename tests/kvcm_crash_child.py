"""Child process of tests/test_kvcm_crash.py (not a test module): drives a KVCacheManager with a disk
level until the parent SIGKILLs it, and logs what it did to an append-only file.

Usage: ``python kvcm_crash_child.py DISK_DIR LOG_FILE GENERATION SEED``. Imported by the test for
the shared configuration and page contents.

Log lines (one ``os.write`` each, so a SIGKILL leaves every line before it intact and at most one
torn line at the end):

* ``C k``: key ``k`` was found on disk at start and claimed (before ``READY``);
* ``READY``: the manager is open (also printed on stdout);
* ``I k v``: from now on the disk may hold key ``k`` with version ``v`` (written before a call
  that may put it there: an explicit migration to disk, or an allocation / ``make_room`` whose
  eviction cascade may reach the disk);
* ``IE k``: from now on key ``k`` may be gone from the disk (before an onboard, a disk -> host
  copy or a free of its disk page);
* ``S k v`` / ``S k -``: the call returned; the disk now durably holds ``k`` at version ``v``
  (its page is at the disk level) / does not hold ``k`` (its page is elsewhere);
* ``V k v``: the child onboarded ``k`` and checked it byte for byte (version ``v``);
* ``BAD ...``: the child saw wrong bytes or an unexpected drop (it then exits with status 3).

``KVCODEC_CRASH_DEVICE`` (default ``cpu``; ``cuda`` or ``cuda:N`` on a GPU host) is the child's
device: with a GPU its hot tier lives in device memory and every hot <-> cold move runs the CUDA
codec path, while the parent still checks the disk with a CPU manager (the blob format is one).

Keys ``0 .. KEYS-1``; key ``k`` belongs to layer group ``k % 2``. A page with key ``k`` and
version ``v`` holds ``content(k, v)``. Keys in ``replace_keys(generation)`` are left unclaimed at
start and only ever written by a hot -> disk put that replaces the unclaimed page (if any).
"""

from __future__ import annotations

import hashlib
import os
import random
import sys

KEYS = 32
FILLERS = 24  # unkeyed pages kept alive at most (they spill to disk too, and are erased at reopen)
CONTAINER = 16 * 4096
DEVICE = os.environ.get("KVCODEC_CRASH_DEVICE", "cpu")


def key_bytes(k: int) -> bytes:
    return b"key-%04d" % k


def make_config(disk_dir: str, device: str = "cpu"):
    from kvcodec_sdk import BufferDesc, DiskTierConfig, KVCacheConfig, LayerGroupConfig, Role

    def lg(layers, size):
        return LayerGroupConfig([BufferDesc(l, r, bytes=size) for l in layers for r in (Role.KEY, Role.VALUE)])

    # Layer group 0: 2 layers x (K, V) x 512 B = 2 KiB pages; layer group 1: 1 layer x 2 x 1 KiB.
    # Hot: 8 + 16 slots, host: 8 + 16 slots, so the child's 32 keys and 24 fillers overflow both
    # and cascade down to the disk; the disk (256 + 256 slots) never fills, so nothing is dropped.
    return KVCacheConfig(layer_groups=[lg([0, 1], 512), lg([2], 1024)], gpu_quota=2048 * 16, host_quota=2048 * 16,
                         device=device, disk=DiskTierConfig(disk_dir, max_bytes=2 * 256 * 4096,
                                                           container_bytes=CONTAINER, io_mode="buffered"))


def lifecycle(k: int) -> int:
    return k % 2


def content(k: int, v: int, nbytes: int) -> bytes:
    head = b"K%04d:V%012d:" % (k, v)
    body = b""
    block = hashlib.blake2b(head).digest()
    while len(head) + len(body) < nbytes:
        body += block
        block = hashlib.blake2b(block).digest()
    return (head + body)[:nbytes]


def parse(data: bytes) -> tuple[int, int] | None:
    """(key, version) from a page's header, or None when it is not one of ours."""
    try:
        if data[0:1] != b"K" or data[5:7] != b":V" or data[19:20] != b":":
            return None
        return int(data[1:5]), int(data[7:19])
    except ValueError:
        return None


def replace_keys(generation: int) -> set[int]:
    return set(random.Random(f"replace:{generation}").sample(range(KEYS), 4))


def main(argv: list[str]) -> int:
    import numpy as np

    from kvcodec_sdk import CacheLevel, KVCacheManager
    from kvcodec_sdk.manager import CapacityError

    disk_dir, log_path, generation, seed = argv[0], argv[1], int(argv[2]), int(argv[3])
    rng = random.Random(seed)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(*parts) -> None:
        os.write(fd, (" ".join(str(p) for p in parts) + "\n").encode())

    HOT, HOST, DISK = CacheLevel.HOT, CacheLevel.HOST, CacheLevel.DISK
    m = KVCacheManager(make_config(disk_dir, DEVICE))
    framework = "numpy" if DEVICE == "cpu" else "cuda"
    nbytes = [m.page_bytes(HOT, m.lifecycle_to_pool_group(HOT)[lc]) for lc in range(2)]
    hot_group = m.lifecycle_to_pool_group(HOT)
    host_group = m.lifecycle_to_pool_group(HOST)
    replace = replace_keys(generation)

    pages: dict[int, object] = {}  # key -> live page handle
    version: dict[int, int | None] = {}  # key -> version of its live page (None: claimed, not read yet)
    fillers: list = []
    counter = 0

    claim = [k for k in range(KEYS) if k not in replace]
    for k, h in zip(claim, m.find_on_disk([key_bytes(k) for k in claim])):
        if h is not None:
            pages[k], version[k] = h, None
            log("C", k)
    log("READY")
    print("READY", flush=True)

    def bad(*parts) -> None:
        log("BAD", *parts)
        sys.stdout.flush()
        os._exit(3)

    # The page reads and writes of tests/test_kvcm_threads.py, written here again: this child runs as
    # a script under PYTHONSAFEPATH (tests/conftest.py), so the test helpers are not importable.
    def write(h, data: bytes) -> None:
        arr = np.frombuffer(data, np.uint8)
        off = 0
        for v in m.page_view(h, framework=framework):
            if framework == "numpy":
                v[:] = arr[off:off + v.shape[0]]
            else:
                v.copy_from(arr[off:off + v.shape[0]])  # synchronized before it returns
            off += v.shape[0]

    def read(h) -> bytes:
        if framework == "numpy":
            return b"".join(bytes(v) for v in m.page_view(h, framework="numpy"))
        m.synchronize()  # a CUDA onboard returns once its decodes are queued
        return b"".join(v.numpy().tobytes() for v in m.page_view(h, framework="cuda"))

    def cascade_intents() -> list[int]:
        """Keys whose pages an eviction cascade may carry to the disk."""
        ks = [k for k, h in pages.items() if h.level in (HOT, HOST) and version[k] is not None]
        for k in ks:
            log("I", k, version[k])
        return ks

    def resolve(ks) -> None:
        for k in ks:
            h = pages.get(k)
            if h is not None and h.level == DISK:
                log("S", k, version[k])
            else:
                log("S", k, "-")

    def cascading(call, *args, **kw):
        ks = cascade_intents()
        try:
            return call(*args, **kw)
        finally:
            resolve(ks)

    def next_version() -> int:
        nonlocal counter
        counter += 1
        return generation * 1_000_000 + counter

    def check_onboarded(ks, result) -> None:
        if len(result.dropped):
            bad("dropped", [int(i) for i in result.dropped.ids])
        for k in ks:
            data = read(pages[k])
            got = parse(data)
            if got is None or got[0] != k or (version[k] is not None and got[1] != version[k]):
                bad("header", k, version[k], data[:20])
            if data != content(k, got[1], nbytes[lifecycle(k)]):
                bad("content", k, got[1])
            version[k] = got[1]
            log("V", k, got[1])

    def migrate(handles, level, source=None):
        """A migration, half of the time non-blocking (the I/O thread writes or reads while the
        child waits): either way the call is resolved once it returned or its wait() did."""
        blocking = rng.random() < 0.5
        if source is not None:
            r = m.evict(handles, level=level, blocking=blocking)
        else:
            r = m.migrate(handles, level, blocking=blocking)
        return r if blocking else r.wait()

    def put(ks) -> None:
        """New pages for keys without one: allocate, write, send to disk (direct or via host)."""
        for lc in (0, 1):
            group_keys = [k for k in ks if lifecycle(k) == lc]
            if not group_keys:
                continue
            handles = cascading(m.allocate, lc, len(group_keys), keys=[key_bytes(k) for k in group_keys])
            for k, h in zip(group_keys, handles):
                pages[k] = h
                version[k] = next_version()
                write(h, content(k, version[k], nbytes[lc]))
            if rng.random() < 0.5 or any(k in replace for k in group_keys):
                for k in group_keys:
                    log("I", k, version[k])
                try:
                    migrate(handles, DISK, HOT)
                finally:
                    resolve(group_keys)
            elif rng.random() < 0.7:
                cascading(m.make_room, HOST, host_group[lc], len(group_keys))
                m.evict(handles)  # hot -> host: no disk effect
                for k in group_keys:
                    log("I", k, version[k])
                try:
                    migrate(handles, DISK)  # host -> disk: raw blob copy
                finally:
                    resolve(group_keys)

    def leave_disk(ks, how: str) -> None:
        hs = [pages[k] for k in ks]
        if how == "onboard":
            cascading(m.make_room, HOT, hot_group[lifecycle(ks[0])], len(ks))
        elif how == "up":
            cascading(m.make_room, HOST, host_group[lifecycle(ks[0])], len(ks))
        for k in ks:
            log("IE", k)
        try:
            if how == "onboard":
                r = m.onboard(hs, source=DISK)
            elif how == "up":
                r = migrate(hs, HOST)
            else:
                m.free(hs)
                r = None
        finally:
            if how == "free":
                for k in ks:
                    pages.pop(k)
                    version.pop(k)
            resolve(ks)
        if how == "onboard":
            check_onboarded(ks, r)
        elif how == "up":
            if len(r.dropped):
                bad("dropped", [int(i) for i in r.dropped.ids])

    while True:
        action = rng.choices(["put", "onboard", "up", "down", "free", "rewrite", "filler", "unfill"],
                             weights=[6, 4, 1, 2, 2, 2, 3, 2])[0]
        try:
            if action == "put":
                free_keys = [k for k in range(KEYS) if k not in pages]
                if free_keys:
                    put(rng.sample(free_keys, min(len(free_keys), rng.randint(1, 6))))
            elif action in ("onboard", "up", "free"):
                lc = rng.randint(0, 1)
                # A claimed page's version is known once onboarded; only then may it go up to the
                # host, from where a cascade may carry it back (its intent needs the version).
                on_disk = [k for k, h in pages.items() if lifecycle(k) == lc and h.level == DISK
                           and (action != "up" or version[k] is not None)]
                if action == "free" and rng.random() < 0.5:
                    # A page at any level (hot/host frees do not touch the disk).
                    live = [k for k in pages if lifecycle(k) == lc and pages[k].level != DISK]
                    for k in rng.sample(live, min(len(live), 2)):
                        m.free(pages.pop(k))
                        version.pop(k)
                elif on_disk:
                    leave_disk(rng.sample(on_disk, min(len(on_disk), rng.randint(1, 4))), action)
            elif action == "down":
                on_host = [k for k, h in pages.items() if h.level == HOST and version[k] is not None]
                ks = rng.sample(on_host, min(len(on_host), 4))
                if ks:
                    for k in ks:
                        log("I", k, version[k])
                    try:
                        m.migrate([pages[k] for k in ks], DISK)
                    finally:
                        resolve(ks)
            elif action == "rewrite":
                hot = [k for k, h in pages.items() if h.level == HOT]
                for k in rng.sample(hot, min(len(hot), 3)):
                    if version[k] is not None:
                        data = read(pages[k])
                        if data != content(k, version[k], nbytes[lifecycle(k)]):
                            bad("hot content", k, version[k])
                    version[k] = next_version()
                    write(pages[k], content(k, version[k], nbytes[lifecycle(k)]))
            elif action == "filler":
                lc = rng.randint(0, 1)
                n = min(FILLERS - len(fillers), rng.randint(1, 6))
                if n > 0:
                    hs = cascading(m.allocate, lc, n)
                    for h in hs:
                        write(h, bytes([0xF0 | lc]) * nbytes[lc])
                    fillers.extend(hs)
            elif action == "unfill" and fillers:
                rng.shuffle(fillers)
                m.free(fillers[:3])
                del fillers[:3]
        except CapacityError:
            pass  # a level too full for an explicit migration: nothing changed
        if sum(s["drops"] for s in m.level_stats(DISK)) or sum(s.pages_dropped for s in m.stats(DISK)):
            bad("the disk level dropped pages", m.level_stats(DISK))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
