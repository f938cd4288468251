"""Crash safety of the KV-cache manager's disk level: a child process (tests/kvcm_crash_child.py)
drives a KVCacheManager whose hot and host tiers overflow into a disk level, with content keys,
explicit hot -> disk and host -> disk migrations, eviction cascades reaching the disk, onboards,
disk -> host copies, frees, and pages left unclaimed from the previous run that a new put replaces;
the parent SIGKILLs it at random moments (also while it is still opening the level).

The child logs, before every call that may change what the disk holds, which keys may change
(``I k v``: may now hold version v; ``IE k``: may now be gone), and after the call the state it
acknowledges durable (``S k v`` / ``S k -``). After every kill the parent opens a new manager on
the same directory, claims every key with ``find_on_disk`` (plus decoy keys never written),
onboards every page found and checks:

* 0 lost: every key acknowledged on disk, with no change in flight, is there at exactly that version;
* 0 phantom: no decoy key, no key never written, no version never written, no unclaimed leftover
  (unkeyed pages are erased at open), and disk slots in use equal the keys found;
* 0 corrupt: every page served holds exactly the bytes of its key and version, none is dropped
  (no checksum failure) on the way;
* a key with a change in flight holds its old state or one of the states the change may give;
* a key whose page left the disk (onboard, disk -> host, free) may come back at exactly the
  version that left, because the manager does not wait for that erase to be durable before the
  call returns (see ``Model.resurrectable``); any other version is a failure ("stale").

The parent then puts the pages back on disk (so the next child starts with them unclaimed) and
checks that the child claims exactly the keys on disk. ``KVCODEC_CRASH_ITERATIONS`` (default 5)
and ``KVCODEC_CRASH_SEED`` set the number of kills and the seed; every failure names both.
``KVCODEC_CRASH_DEVICE=cuda`` runs the children on a GPU (the test is skipped without one); the
parent checks the disk with a CPU manager either way.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import kvcm_crash_child as child
import pytest

from kvcodec_sdk import CacheLevel, KVCacheManager

CHILD = str(Path(child.__file__).resolve())
ITERATIONS = int(os.environ.get("KVCODEC_CRASH_ITERATIONS", "5"))
SEED = int(os.environ.get("KVCODEC_CRASH_SEED", "4242"))
DECOYS = [child.KEYS + i for i in range(8)]  # keys no child ever writes


class Model:
    """What the parent knows about the disk from the children's logs: per key, the acknowledged
    state (version or None) and, while a change is in flight, the states it may have left."""

    def __init__(self):
        self.state: dict[int, int | None] = {k: None for k in range(child.KEYS)}
        self.pending: dict[int, set] = {}
        self.written: dict[int, set] = {k: set() for k in range(child.KEYS)}  # every version ever offered
        self.before_erase: dict[int, int | None] = {}
        # Leaving the disk level (onboard, disk -> host, free) submits the blob's erase and returns
        # without waiting for it (kvcm/disk_level.cpp, DiskColdLevel::release: the erase ticket
        # is waited for before later writes). Until a later put of the key is acknowledged, a
        # crash may therefore bring back exactly the version that left the disk, never another.
        self.resurrectable: dict[int, int] = {}
        self.resurrected = 0
        self.acks = 0  # "S k v" lines: puts acknowledged durable
        self.erases = 0
        self.in_flight_at_kill = 0

    def feed(self, lines: list[str], gen: int, where: str) -> set[int]:
        claimed: set[int] = set()
        for line in lines:
            parts = line.split()
            tag = parts[0]
            if tag == "BAD":
                raise AssertionError(f"{where}: the child saw {line!r}")
            if tag in ("READY",):
                continue
            k = int(parts[1])
            if tag == "C":
                claimed.add(k)
            elif tag == "I":
                v = int(parts[2])
                self.written[k].add(v)
                self.pending.setdefault(k, {self.state[k]}).add(v)
            elif tag == "IE":
                self.before_erase[k] = self.state[k]
                self.pending.setdefault(k, {self.state[k]}).add(None)
            elif tag == "S":
                v = None if parts[2] == "-" else int(parts[2])
                if v is not None:
                    assert v in self.written[k], f"{where}: S {k} {v} without an intent"
                    self.acks += self.state[k] != v
                    self.resurrectable.pop(k, None)
                elif self.state[k] is not None:
                    self.erases += 1
                    self.resurrectable[k] = self.state[k]
                self.state[k] = v
                self.pending.pop(k, None)
            elif tag == "V":
                v = int(parts[2])
                want = self.before_erase.get(k)
                assert v == want, f"{where}: the child onboarded key {k} at version {v}; the disk held {want}"
            else:
                raise AssertionError(f"{where}: unknown log line {line!r}")
        self.in_flight_at_kill += len(self.pending)
        return claimed

    def allowed(self, k: int) -> set:
        allowed = set(self.pending.get(k, {self.state[k]}))
        if k in self.resurrectable:
            allowed.add(self.resurrectable[k])
        return allowed

    def settle(self, observed: dict[int, int | None]) -> None:
        """After a verification: the disk holds exactly what was observed (the parent put it back)."""
        self.resurrected += sum(1 for k, v in observed.items()
                                if v is not None and self.resurrectable.get(k) == v and v != self.state[k]
                                and v not in self.pending.get(k, set()))
        self.state = dict(observed)
        self.pending.clear()
        self.before_erase.clear()
        self.resurrectable.clear()


def read_log(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_bytes().decode(errors="replace")
    return text.split("\n")[:-1]  # the last element is a torn line or ""


def verify(disk_dir: str, model: Model, where: str) -> dict[int, int | None]:
    """Opens a manager on the disk level, checks every key against the model, puts every page
    found back on disk, and returns what the disk holds."""
    m = KVCacheManager(child.make_config(disk_dir))
    problems: list[str] = []
    try:
        keys = list(range(child.KEYS)) + DECOYS
        unclaimed = m.unclaimed_on_disk()
        found = m.find_on_disk([child.key_bytes(k) for k in keys])
        for k, h in zip(keys, found):
            if k in DECOYS and h is not None:
                problems.append(f"phantom: decoy key {k} (never written) is on disk")
        found = {k: h for k, h in zip(keys, found) if h is not None and k not in DECOYS}
        if m.unclaimed_on_disk() != 0:
            problems.append(f"phantom: {m.unclaimed_on_disk()} unclaimed pages under keys never written")
        if unclaimed != len(found):
            problems.append(f"{unclaimed} unclaimed pages at open, {len(found)} keys found")
        used = sum(total - free for total, free in m.slot_counts(CacheLevel.DISK))
        if used != len(found):
            problems.append(f"phantom: {used} disk slots in use for {len(found)} keys found (unkeyed leftovers?)")
        observed: dict[int, int | None] = {k: None for k in range(child.KEYS)}
        items = sorted(found.items())
        for lc in (0, 1):
            mine = [(k, h) for k, h in items if child.lifecycle(k) == lc]
            for i in range(0, len(mine), 4):
                chunk = mine[i:i + 4]
                r = m.onboard([h for _, h in chunk], source=CacheLevel.DISK)
                dropped = {int(x) for x in r.dropped.ids}
                back = []
                for k, h in chunk:
                    if h.id in dropped:
                        problems.append(f"corrupt: key {k} was dropped on onboarding (checksum or missing blob)")
                        continue
                    data = b"".join(bytes(v) for v in m.page_view(h, framework="numpy"))
                    head = child.parse(data)
                    if head is None or head[0] != k:
                        problems.append(f"corrupt: key {k} serves a page with header {data[:20]!r}")
                        continue
                    v = head[1]
                    if data != child.content(k, v, len(data)):
                        problems.append(f"corrupt: key {k} version {v}: the bytes differ from what was written")
                        continue
                    if v not in model.written[k]:
                        problems.append(f"phantom: key {k} holds version {v}, which was never written")
                    observed[k] = v
                    back.append(h)
                if back:
                    m.evict(back, level=CacheLevel.DISK)  # the next child finds them unclaimed
        for k in range(child.KEYS):
            allowed = model.allowed(k)
            if observed[k] in allowed or any(p.startswith(("corrupt", "phantom")) and f"key {k} " in p
                                             for p in problems):
                continue
            if observed[k] is None:
                problems.append(f"lost: key {k} acknowledged at version {model.state[k]} is gone"
                                + (f" (in flight: {sorted(allowed, key=str)})" if k in model.pending else ""))
            else:
                problems.append(f"stale: key {k} holds version {observed[k]}; allowed {sorted(allowed, key=str)}")
        for g in range(m.num_pool_groups(CacheLevel.DISK)):
            if m.disk_stats(g)["checksum_failures"]:
                problems.append(f"corrupt: disk pool group {g} counted checksum failures")
    finally:
        m.close()
    assert not problems, f"{where}: " + "; ".join(problems)
    return observed


def test_sigkilled_manager_loses_no_acknowledged_page_and_serves_no_phantom(tmp_path):
    if child.DEVICE != "cpu":
        from kvcodec_sdk import gpu

        if not gpu.available():
            pytest.skip(f"KVCODEC_CRASH_DEVICE={child.DEVICE}, but no GPU: {gpu.unavailable_reason()}")
    disk_dir = str(tmp_path / "disk")
    rng = random.Random(SEED)
    model = Model()
    kills_after_ready = 0
    for gen in range(1, ITERATIONS + 1):
        where = (f"generation {gen} (KVCODEC_CRASH_SEED={SEED}, KVCODEC_CRASH_ITERATIONS={ITERATIONS}, "
                 f"KVCODEC_CRASH_DEVICE={child.DEVICE})")
        log = tmp_path / f"gen{gen}.log"
        err = tmp_path / f"gen{gen}.err"
        with open(err, "wb") as stderr:
            proc = subprocess.Popen([sys.executable, CHILD, disk_dir, str(log), str(gen), str(rng.randrange(1 << 30))],
                                    stdout=subprocess.PIPE, stderr=stderr)
        early = rng.random() < 0.25
        if early:  # possibly while the child still opens (and recovers) the disk level
            time.sleep(rng.uniform(0.0, 0.5))
        else:
            line = proc.stdout.readline()
            assert line.strip() == b"READY", f"{where}: {err.read_text()}"
            time.sleep(rng.uniform(0.02, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        assert proc.returncode == -signal.SIGKILL, f"{where}: the child exited with {proc.returncode}: {err.read_text()}"
        lines = read_log(log)
        ready = "READY" in lines
        kills_after_ready += ready
        on_disk_before = {k for k, v in model.state.items() if v is not None}
        claimed = model.feed(lines, gen, where)
        if ready:
            expected_claims = on_disk_before - child.replace_keys(gen)
            assert claimed == expected_claims, f"{where}: claimed {sorted(claimed)}, on disk {sorted(expected_claims)}"
        model.settle(verify(disk_dir, model, where))
    summary = (f"{child.DEVICE}: {ITERATIONS} kills ({kills_after_ready} after READY), {model.acks} puts and {model.erases} erases "
               f"acknowledged, {model.in_flight_at_kill} keys in flight at a kill, {model.resurrected} erased "
               f"pages back after a kill")
    assert kills_after_ready >= 1, f"no child was killed after it opened the manager: {summary}"
    if ITERATIONS >= 5:
        assert model.acks >= 10, f"the children did too little: {summary}"
    print(summary)  # what a long run exercised (pytest -s shows it)
