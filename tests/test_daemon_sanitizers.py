"""The daemon's native server and client under AddressSanitizer with UndefinedBehaviorSanitizer, and
under ThreadSanitizer: tests/native/daemon_stress.cpp built against csrc/src/daemon/ and run (four
client threads against one server, random operations, every page read checked); and the daemon's
key table (the disk tier's too) against std::unordered_map under AddressSanitizer
(tests/native/key_table_test.cpp)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "tests" / "native" / "daemon_stress.cpp",
           *(ROOT / "csrc" / "src" / "daemon" / f"{n}.cpp"
             for n in ("arena", "l2_index", "server", "server_promote", "client", "values", "long_tier"))]
SANITIZERS = {"address,undefined": {"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"},
              "thread": {"TSAN_OPTIONS": "halt_on_error=1"}}


def compiler() -> str:
    """$CXX, g++ or c++; the test is skipped without one."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    return cxx


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    """Both builds, compiled side by side."""
    cxx = compiler()
    out = tmp_path_factory.mktemp("daemon-sanitizers")
    builds = {}
    for sanitizer in SANITIZERS:
        exe = out / f"daemon_stress_{sanitizer.split(',')[0]}"
        cmd = [cxx, "-std=c++17", "-O1", "-g", f"-fsanitize={sanitizer}", "-fno-omit-frame-pointer",
               f"-I{ROOT / 'csrc' / 'include'}", f"-I{ROOT / 'csrc' / 'src'}", *map(str, SOURCES), "-o", str(exe),
               "-lpthread"]
        builds[sanitizer] = (exe, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    done = {}
    for sanitizer, (exe, proc) in builds.items():
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, log
        done[sanitizer] = exe
    return done


@pytest.mark.parametrize("long_tier", [False, True], ids=["l2", "long-tier"])
@pytest.mark.parametrize("sanitizer", list(SANITIZERS))
def test_the_daemon_under_a_sanitizer(binaries, sanitizer, long_tier, tmp_path):
    env = {**os.environ, **SANITIZERS[sanitizer]}
    extra = [str(tmp_path / "long")] if long_tier else []
    r = subprocess.run([str(binaries[sanitizer]), str(tmp_path / "kvd.sock"), "3", *extra], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-6000:]
    assert "Sanitizer" not in r.stderr, r.stderr[-6000:]
    assert "wrong 0" in r.stdout
    if long_tier:  # the long tier took part: pages written back and read back into L2
        stats = json.loads(r.stdout.splitlines()[1])
        assert stats["write_backs"] > 0 and stats["promotions"] > 0, stats


def test_the_key_table_matches_a_map_under_asan(tmp_path):
    """The key table of the daemon and the disk tier (open addressing, erases that shift entries
    back; entries holding keys of up to 50 bytes, or a tag of the hash) answers as
    std::unordered_map does through random inserts, finds, moves and erases in nearly full tables,
    sized once or grown, under AddressSanitizer and UBSan."""
    exe = tmp_path / "key_table_test"
    build = subprocess.run([compiler(), "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                            f"-I{ROOT / 'csrc' / 'src'}", str(ROOT / "tests" / "native" / "key_table_test.cpp"),
                            "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **SANITIZERS["address,undefined"]})
    assert r.returncode == 0 and "mismatches 0" in r.stdout, r.stdout + r.stderr[-6000:]
    assert "operations 480000" in r.stdout
