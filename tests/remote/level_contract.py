"""The remote tier as a cold level of the KV-cache manager (``CacheLevel.REMOTE``), against a real
server: a mixin each backend's test module subclasses, with the same fixtures as
``remote_contract.BackendContract`` (``store``, ``make_backend``, ``raw_put``,
``restart_iterations``).

Managers run on the CPU backend (the same migration paths and staging as on a GPU, with CPU
reference codecs). Page contents are random; a wrong page is one whose onboarded bytes differ from
what was written into it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kvcodec_sdk import CacheLevel, KVCacheConfigError, KVCacheManager, RemoteTierConfig
from kvcodec_sdk.manager import MigrationError
from kvcodec_sdk.remote.level import blob_name, store_key

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from test_kvcm_support import config, group, hot_bytes, make_test_codec, write_random  # noqa: E402

GROUPS = [group([0, 1], [64, 32]), group([2], [48])]  # two cold pool groups (192- and 48-byte pages)


def keys_for(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def until_stored(evict, timeout_s: float = 30.0):
    """``evict()`` retried while it raises MigrationError (a store that just restarted), bounded."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return evict()
        except MigrationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class ManagerLevelContract:
    """Every backend carries a manager's remote level the same way."""

    timeout_s = 2.0

    @pytest.fixture
    def manager(self, make_backend):
        """``manager(codec=None, **config)``: a CPU manager whose remote level uses a backend of
        ``make_backend`` built with its identity; all are closed at teardown."""
        made: list[KVCacheManager] = []

        def make(codec=None, max_pages=256, timeout_s=None, groups=GROUPS, **kw):
            probe = config(groups, **kw)
            identity = KVCacheManager.remote_identity(probe, codec)
            backend = make_backend(identity, timeout_s=timeout_s or self.timeout_s)
            cfg = config(groups, remote=RemoteTierConfig(backend, max_pages=max_pages), **kw)
            m = KVCacheManager(cfg, cold_page_codec=codec)
            made.append(m)
            return m

        yield make
        for m in made:
            m.close()

    @staticmethod
    def check(m, pages, model):
        wrong = [p for p in pages if not np.array_equal(hot_bytes(m, p), model[p.id])]
        assert not wrong, wrong

    # -- round trips ---------------------------------------------------------------------------

    @pytest.mark.parametrize("codec", [None, "test"])
    def test_hot_remote_hot_is_byte_exact(self, manager, codec):
        m = manager(make_test_codec() if codec else None)
        rng = np.random.default_rng(1)
        pages = m.allocate(0, 6) + m.allocate(1, 3)
        model = write_random(m, pages, rng)
        m.set_keys(pages[:5], keys_for("rt", 5))  # keyed and anonymous pages alike
        r = m.evict(pages, level=CacheLevel.REMOTE)
        assert r.moved == 9 and all(p.level == CacheLevel.REMOTE for p in pages)
        assert [s.pages_offloaded for s in m.stats(CacheLevel.REMOTE)] == [6, 3]
        for lc in range(m.num_layer_groups):
            for pool in m.hot_pool_tensors(lc):
                pool[:] = 0
        r = m.onboard(pages, source=CacheLevel.REMOTE)
        assert r.moved == 9 and not r.dropped and not r.failed
        self.check(m, pages, model)
        st = m.remote_stats()
        assert st["puts"] == 9 and st["hits"] == 9 and st["misses"] == 0 and st["corrupt"] == 0
        assert all(free == total for total, free in m.slot_counts(CacheLevel.REMOTE))

    def test_host_remote_host_moves_the_blobs_raw(self, manager):
        m = manager(make_test_codec())
        rng = np.random.default_rng(2)
        pages = m.allocate(0, 4)
        model = write_random(m, pages, rng)
        m.evict(pages)
        m.synchronize()
        blobs = {p.id: np.array(m.page_view(p)[0]) for p in pages}
        m.migrate(pages, CacheLevel.REMOTE)
        for g in range(m.num_pool_groups(CacheLevel.HOST)):
            m.host_pool_array(g)[:] = 0
        m.migrate(pages, CacheLevel.HOST)
        m.synchronize()
        assert all(np.array_equal(m.page_view(p)[0], blobs[p.id]) for p in pages)
        m.onboard(pages)
        self.check(m, pages, model)

    def test_non_blocking_migrations_return_at_once_and_land(self, manager):
        m = manager()
        rng = np.random.default_rng(3)
        pages = m.allocate(0, 8)
        model = write_random(m, pages, rng)
        pending = m.evict(pages, level=CacheLevel.REMOTE, blocking=False)
        r = pending.wait(timeout=30)
        assert pending.done() and r.moved == 8
        assert all(p.level == CacheLevel.REMOTE for p in pages)
        pending = m.onboard(pages, source=CacheLevel.REMOTE, blocking=False)
        assert pending.wait(timeout=30).moved == 8
        self.check(m, pages, model)

    def test_threads_migrating_their_own_pages_never_see_wrong_bytes(self, manager):
        m = manager(max_pages=512, gpu_quota=1 << 17)
        errors: list[BaseException] = []

        def work(seed: int) -> None:
            try:
                rng = np.random.default_rng(seed)
                for _ in range(5):
                    pages = m.allocate(0, 4)
                    model = write_random(m, pages, rng)
                    m.set_keys(pages, [f"t{seed}-{rng.integers(1 << 40)}-{i}".encode() for i in range(4)])
                    m.evict(pages, level=CacheLevel.REMOTE)
                    m.onboard(pages, source=CacheLevel.REMOTE)
                    self.check(m, pages, model)
                    m.free(pages)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors

    # -- sharing -------------------------------------------------------------------------------

    def test_another_manager_finds_and_onboards_the_pages(self, manager):
        writer, reader = manager(), manager()
        rng = np.random.default_rng(4)
        pages = writer.allocate(0, 5) + writer.allocate(1, 2)
        model = write_random(writer, pages, rng)
        keys = keys_for("shared", 7)
        writer.set_keys(pages, keys)
        writer.evict(pages, level=CacheLevel.REMOTE)
        found = reader.find_remote([*keys, b"never-stored"])
        assert found[-1] is None and all(f is not None for f in found[:-1])
        assert [f.lifecycle for f in found[:-1]] == [p.lifecycle for p in pages]
        assert reader.find_remote(keys[:2]) == found[:2]  # a live remote page answers for its key
        r = reader.onboard(found[:-1], source=CacheLevel.REMOTE)
        assert r.moved == 7
        for f, p in zip(found, pages):
            assert np.array_equal(hot_bytes(reader, f), model[p.id])
        assert reader.find_remote([keys[0]], lifecycle=1) == [None]  # stored under lifecycle 0 only

    def test_keys_found_but_not_claimed_leave_no_offer_behind(self, manager):
        """A reader whose remote level has too few slots claims what fits; the other keys found in
        the store are not kept as offers (a later find asks the store again)."""
        writer, reader = manager(), manager(max_pages=2)
        pages = writer.allocate(0, 5)
        write_random(writer, pages, np.random.default_rng(12))
        keys = keys_for("offers", 5)
        writer.set_keys(pages, keys)
        writer.evict(pages, level=CacheLevel.REMOTE)
        got = [f for f in reader.find_remote(keys) if f is not None]
        assert 0 < len(got) < 5
        assert reader.remote_stats()["offers"] == 0
        reader.free(got)
        assert sum(f is not None for f in reader.find_remote(keys)) == len(got)
        assert reader.remote_stats()["offers"] == 0

    def test_another_process_finds_what_this_one_stored(self, manager, store_args):
        m = manager()
        rng = np.random.default_rng(5)
        pages = m.allocate(0, 6)
        model = write_random(m, pages, rng)
        keys = keys_for("proc", 6)
        m.set_keys(pages, keys)
        m.evict(pages, level=CacheLevel.REMOTE)
        expected = np.stack([model[p.id] for p in pages])
        out = Path(store_args["tmp"]) / "onboarded.npy"
        reader = subprocess.run([sys.executable, "-c", READER, repr(store_args), str(out)], cwd="/",
                                capture_output=True, text=True, timeout=120)
        assert reader.returncode == 0, reader.stdout + reader.stderr
        assert np.array_equal(np.load(out), expected)

    # -- refusals ------------------------------------------------------------------------------

    def test_another_codec_never_decodes_the_blobs(self, manager, make_backend, raw_put):
        concat, other = manager(), manager(make_test_codec())
        rng = np.random.default_rng(6)
        pages = concat.allocate(0, 3)
        write_random(concat, pages, rng)
        keys = keys_for("mismatch", 3)
        concat.set_keys(pages, keys)
        concat.evict(pages, level=CacheLevel.REMOTE)
        assert other.find_remote(keys) == [None] * 3  # another identity's namespace
        # A value of another identity stored under this manager's very key: found, never decoded.
        name = blob_name(keys[0], 0)
        foreign = make_backend("fp8/1/fedcba9876543210")
        key = store_key(other._remote.backend.identity, name)
        foreign.put_batch([key], [np.zeros(other.cold_page_bytes(0), np.uint8)])
        (page,) = other.find_remote([keys[0]])
        r = other.onboard([page], source=CacheLevel.REMOTE)
        assert r.moved == 0 and len(r.dropped) == 1 and not page.is_live
        assert other.remote_stats()["mismatches"] == 1

    def test_a_missing_or_corrupt_blob_is_dropped(self, manager, raw_put):
        writer, reader = manager(), manager()
        rng = np.random.default_rng(7)
        pages = writer.allocate(0, 3)
        write_random(writer, pages, rng)
        keys = keys_for("drop", 3)
        writer.set_keys(pages, keys)
        writer.evict(pages, level=CacheLevel.REMOTE)
        found = reader.find_remote(keys)
        be = reader._remote.backend
        names = [blob_name(k, 0) for k in keys]
        be.remove_batch([store_key(be.identity, n) for n in names[:2]])  # (a store may keep a key's first value)
        raw_put(be, store_key(be.identity, names[1]), b"not a value of this tier")
        r = reader.onboard(found, source=CacheLevel.REMOTE)
        assert r.moved == 1 and len(r.dropped) == 2
        assert not found[0].is_live and not found[1].is_live and found[2].level == CacheLevel.HOT
        st = reader.remote_stats()
        assert st["misses"] == 1 and st["corrupt"] == 1

    def test_configuration_errors_name_the_field(self, manager, make_backend):
        with pytest.raises(KVCacheConfigError, match=r"remote.backend is a str"):
            config(GROUPS, remote=RemoteTierConfig("valkey://nowhere")).validate()
        with pytest.raises(KVCacheConfigError, match=r"remote.max_pages"):
            config(GROUPS, remote=RemoteTierConfig(lambda i: None, max_pages=0)).validate()
        wrong = make_backend("concat/1/0000000000000000")
        with pytest.raises(KVCacheConfigError, match="built for another codec identity"):
            KVCacheManager(config(GROUPS, remote=RemoteTierConfig(wrong)))
        with pytest.raises(KVCacheConfigError, match="returned a NoneType"):
            KVCacheManager(config(GROUPS, remote=RemoteTierConfig(lambda identity: None)))
        m = manager()
        with pytest.raises(ValueError, match="lifecycle is 5"):
            m.find_remote([b"k"], lifecycle=5)
        with pytest.raises(ValueError, match="cannot be resized"):
            m.resize(CacheLevel.REMOTE, 1 << 20)
        plain = KVCacheManager(config(GROUPS))
        with pytest.raises(ValueError, match="no remote tier"):
            plain.find_remote([b"k"])
        plain.close()

    # -- failures ------------------------------------------------------------------------------

    def test_a_dead_store_fails_migrations_without_losing_pages(self, manager, store):
        m = manager(timeout_s=1.0)
        rng = np.random.default_rng(8)
        pages = m.allocate(0, 4)
        model = write_random(m, pages, rng)
        m.set_keys(pages, keys_for("dead", 4))
        m.evict(pages[:2], level=CacheLevel.REMOTE)
        store.kill()
        t0 = time.monotonic()
        with pytest.raises(MigrationError):
            m.evict(pages[2:], level=CacheLevel.REMOTE)
        with pytest.raises(MigrationError):
            m.onboard(pages[:2], source=CacheLevel.REMOTE)
        assert time.monotonic() - t0 < 20  # bounded by the backend's timeout, never hung
        assert [p.level for p in pages] == [CacheLevel.REMOTE] * 2 + [CacheLevel.HOT] * 2
        self.check(m, pages[2:], model)  # the failed eviction changed nothing
        store.start()  # empty: what it held is gone
        deadline = time.monotonic() + 30
        while True:  # the client reconnects by itself (Mooncake's within seconds)
            try:
                r = m.onboard(pages[:2], source=CacheLevel.REMOTE)
                break
            except MigrationError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert r.moved == 0 and len(r.dropped) == 2  # misses, never wrong data
        # A restarted store may refuse puts for a while (Mooncake: until the client remounted its
        # segment, as full): each refusal changes nothing, and a later try stores the pages.
        assert until_stored(lambda: m.evict(pages[2:], level=CacheLevel.REMOTE)).moved == 2
        m.onboard(pages[2:], source=CacheLevel.REMOTE)
        self.check(m, pages[2:], model)

    def test_kill_and_restart_during_transfers_never_serves_a_wrong_page(self, manager, store, restart_iterations):
        """Each round: 16 pages go to the store, then the store is killed at a random moment while
        they come back and 16 more go out (both non-blocking), and restarted empty. Every page
        ends at the hot level with its own bytes, or dropped as a miss: never with wrong bytes."""
        m = manager(timeout_s=1.0, max_pages=4096, groups=[group([0, 1], [16384, 16384])], gpu_quota=8 << 20,
                    host_quota=0)
        rng = np.random.default_rng(9)
        wrong = came_back = failed = dropped = 0
        for it in range(restart_iterations):
            first, second = m.allocate(0, 16), m.allocate(0, 16)
            model = write_random(m, first + second, rng)
            m.set_keys(first + second, keys_for(f"loop{it}", 32))
            until_stored(lambda: m.evict(first, level=CacheLevel.REMOTE))
            killer = threading.Timer(float(rng.uniform(0, 0.004)), store.kill)
            killer.start()
            for pending in (m.onboard(first, source=CacheLevel.REMOTE, blocking=False),
                            m.evict(second, level=CacheLevel.REMOTE, blocking=False)):
                try:
                    pending.wait(timeout=60)
                except MigrationError:
                    failed += 1
            killer.join()
            store.start()
            deadline = time.monotonic() + 60
            while True:
                remote = [p for p in first + second if p.is_live and p.level == CacheLevel.REMOTE]
                try:
                    r = m.onboard(remote, source=CacheLevel.REMOTE) if remote else None
                    break
                except MigrationError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"iteration {it}: the store did not come back")
                    time.sleep(0.2)
            dropped += len(r.dropped) if r else 0
            live = [p for p in first + second if p.is_live]
            assert all(p.level == CacheLevel.HOT for p in live)
            came_back += sum(p in first for p in live)
            wrong += sum(not np.array_equal(hot_bytes(m, p), model[p.id]) for p in live)
            m.free(live)
        print(f"{restart_iterations} kills: {failed} transfers failed, {came_back} pages came back, "
              f"{dropped} dropped as misses, {wrong} wrong")
        assert wrong == 0
        assert failed > 0  # the kills did land while transfers were in flight


READER = """
import ast, sys
import numpy as np
sys.path.insert(0, {tests!r}); sys.path.insert(0, {remote!r})
args = ast.literal_eval(sys.argv[1])
import level_support
m = level_support.reader_manager(args)
found = m.find_remote([f"proc-{{i}}".encode() for i in range(6)])
assert all(f is not None for f in found), found
r = m.onboard(found, source=3)
assert r.moved == 6, r
from test_kvcm_support import hot_bytes
np.save(sys.argv[2], np.stack([hot_bytes(m, f) for f in found]))
m.close()
""".format(tests=str(TESTS), remote=str(Path(__file__).resolve().parent))
