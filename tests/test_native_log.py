"""The C++ core's messages reach Python's logging (logger ``kvcodec_sdk.native``), from native
threads too, without a deadlock: the core queues them and the interpreter delivers them on the
main thread (``_native.flush_log()`` at once)."""

from __future__ import annotations

import logging
import sys
import threading

import numpy as np
import pytest
from test_kvcm_support import config, damage_first_blob, group, write_random

import kvcodec_sdk
from kvcodec_sdk import CacheLevel, DiskTierConfig, KVCacheManager, _native

LOGGER = "kvcodec_sdk.native"
log_from_threads = _native.kvcm_testing.log_from_threads


def native_records(caplog) -> list[tuple[int, str]]:
    _native.flush_log()
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def test_messages_from_native_threads_reach_logging(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    log_from_threads(logging.WARNING, "from a native thread", threads=4, per_thread=25)
    log_from_threads(logging.INFO, "info", threads=1, per_thread=1)
    got = native_records(caplog)
    warnings = sorted(m for lvl, m in got if lvl == logging.WARNING)
    assert warnings == sorted(f"from a native thread {i}.{j}" for i in range(4) for j in range(25))
    assert (logging.INFO, "info 0.0") in got


def test_delivery_needs_no_flush_on_the_main_thread(caplog):
    """The interpreter runs the delivery by itself soon after the writing call returns."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    log_from_threads(logging.ERROR, "unflushed")
    for _ in range(1000):  # bytecode runs: pending calls get their turn
        if any(r.name == LOGGER and r.getMessage() == "unflushed 0.0" for r in caplog.records):
            break
    assert any(r.levelno == logging.ERROR and r.getMessage() == "unflushed 0.0" for r in caplog.records)


def test_python_threads_writing_and_flushing_together_do_not_deadlock(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                log_from_threads(logging.WARNING, f"thread{i}", threads=2, per_thread=10)
                _native.flush_log()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "native logging deadlocked"
    assert not errors
    got = [m for lvl, m in native_records(caplog) if m.startswith("thread")]
    assert len(got) == 4 * 20 * 2 * 10


def test_a_flood_is_bounded_and_reported(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    log_from_threads(logging.DEBUG, "flood", threads=1, per_thread=5000)  # Python takes none meanwhile
    got = native_records(caplog)
    assert sum(m.startswith("flood") for _, m in got) == 4096
    assert (logging.WARNING, "904 native log messages were discarded (more than 4096 queued before Python "
            "could take them)") in got


def test_a_raising_handler_is_reported_not_propagated(monkeypatch):
    seen, unraisable = [], []

    def handler(level, message):
        seen.append(message)
        raise RuntimeError("handler failed")

    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_value))
    _native.set_log_handler(handler)
    try:
        log_from_threads(logging.WARNING, "to a bad handler")
        _native.flush_log()
    finally:
        _native.set_log_handler(kvcodec_sdk._logging._handle)
    assert seen == ["to a bad handler 0.0"]
    assert [str(e) for e in unraisable] == ["handler failed"]


def test_without_a_handler_messages_go_to_stderr(capfd):
    _native.set_log_handler(None)
    try:
        log_from_threads(logging.WARNING, "to stderr")
    finally:
        _native.set_log_handler(kvcodec_sdk._logging._handle)
    assert "kvcodec: warning: to stderr 0.0" in capfd.readouterr().err
    with pytest.raises(TypeError, match="callable"):
        _native.set_log_handler(42)


def test_a_disk_checksum_mismatch_on_an_io_thread_is_logged(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    groups = [group([0], [4096])]

    def disk_config():
        return config(groups, host_quota=1 << 17, disk=DiskTierConfig(str(tmp_path), max_bytes=8 << 20,
                                                                      container_bytes=1 << 20, io_mode="buffered"))

    m = KVCacheManager(disk_config())
    pages = m.allocate(0, 2, keys=[b"x", b"y"])
    write_random(m, pages, np.random.default_rng(0))
    m.evict(pages, level=CacheLevel.DISK)
    m.close()
    damage_first_blob(tmp_path)
    m2 = KVCacheManager(disk_config())
    r = m2.onboard(m2.find_on_disk([b"x", b"y"]), source=CacheLevel.DISK)
    assert len(r.dropped) == 1
    got = [m for lvl, m in native_records(caplog) if lvl == logging.WARNING and "checksum mismatch" in m]
    assert len(got) == 1 and "served as a miss" in got[0], native_records(caplog)
    m2.close()
