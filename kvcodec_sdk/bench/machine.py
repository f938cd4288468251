"""The machine record every ``kvcodec bench`` JSON report carries (its ``machine`` key).

A figure means little without what it was measured on, so each report names: the time of the run,
the GPU (name, memory, compute capability), the CUDA driver and runtime, the CPU (model, logical
cores, cores this process may use), memory, the OS and kernel, Python, numpy and torch, the SDK
and every installed codec plugin with its version, the git revision of the checkout the SDK or
the working directory is in, and for a disk benchmark the file system and device class of the
directory measured (:func:`kvcodec_sdk.storage_profile.probe_storage`).

Collecting it never fails and never slows a run down: torch is only asked about GPUs when the
benchmark has already imported it (a GPU run), a missing ``git`` or checkout leaves ``git`` None,
and any field that cannot be read says so instead of raising.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import warnings
from dataclasses import asdict
from importlib import metadata
from typing import Any

#: Distributions whose versions the record names when installed (the SDK, its plugins, the
#: libraries a figure depends on).
PACKAGES = ("kvcodec-sdk", "kvcodec-fp8", "kvcodec-nvcomp", "numpy", "torch", "nvidia-libnvcomp-cu13",
            "cupy-cuda13x", "matplotlib")


def now() -> str:
    """The current time, UTC, ISO 8601 with seconds (the record's ``time``)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {"model": _cpu_model(), "logical_cores": os.cpu_count(), "usable_cores": usable,
            "machine": platform.machine()}


def _versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _plugins() -> dict[str, Any]:
    """Every codec with its version and the plugin that registers it, and plugins that failed."""
    try:
        from ..registry import default_registry

        registry = default_registry()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            specs = registry.list_codecs()
            broken = dict(registry.broken_plugins)
        return {"codecs": {s.name: {"version": s.version, "plugin": s.plugin} for s in specs}, "broken": broken}
    except Exception as exc:  # a broken registry must not lose the report
        return {"error": f"{type(exc).__name__}: {exc}"}


def _gpu(device: str | None) -> dict[str, Any]:
    """The CUDA driver as the SDK sees it and, on a GPU run (cuda.core or torch already imported),
    the device."""
    out: dict[str, Any] = {}
    try:
        from .. import _native

        info = dict(_native.driver_info())
        v = int(info.get("driver_version", 0))
        out["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}" if v else None
        out["device_count"] = int(info.get("device_count", 0))
        out["memcpy_batch"] = info.get("memcpy_batch") or None
    except Exception as exc:
        out["error"] = f"driver_info failed: {type(exc).__name__}: {exc}"
    index = int(device.partition(":")[2] or 0) if device and device.startswith("cuda") else 0
    core = sys.modules.get("cuda.core")  # imported by a GPU benchmark (kvcodec_sdk.gpu); a CPU run does not pay
    if core is not None and out.get("device_count"):
        try:
            from cuda.bindings import driver

            d = core.Device(index)
            cc = d.compute_capability
            err, total = driver.cuDeviceTotalMem(index)
            out.update(index=index, name=d.name, compute_capability=f"{cc.major}.{cc.minor}",
                       multiprocessors=int(d.properties.multiprocessor_count),
                       memory_bytes=int(total) if err == driver.CUresult.CUDA_SUCCESS else None)
            build = int(info.get("cuda_build", 0))
            out["cuda_runtime"] = f"{build // 1000}.{build % 1000 // 10}" if build else None
            return out
        except Exception as exc:
            out["cuda_core_error"] = f"{type(exc).__name__}: {exc}"
    torch = sys.modules.get("torch")  # imported by a GPU benchmark that uses torch
    if torch is None:
        return out
    try:
        out["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(index)
            out.update(index=index, name=props.name, memory_bytes=int(props.total_memory),
                       compute_capability=f"{props.major}.{props.minor}",
                       multiprocessors=int(props.multi_processor_count))
    except Exception as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _git_at(folder: str) -> dict[str, Any] | None:
    """The revision of the SDK's repository checked out at or above ``folder`` (a checkout of
    something else, e.g. a Python installation kept in git, is not it)."""
    try:
        top = subprocess.run(["git", "-C", folder, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=5)
        if top.returncode != 0 or not os.path.isdir(os.path.join(top.stdout.strip(), "kvcodec_sdk")):
            return None
        rev = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=5)
        return {"revision": rev.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0
                else None}
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None


def _git() -> dict[str, Any] | None:
    """The revision the SDK was built from: its checkout (an editable install, a run from the
    source tree), the VCS commit pip recorded for an install from a repository, or the checkout
    of the working directory. None when there is none."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = _git_at(os.path.dirname(package))
    if found is not None:
        return found | {"of": "the SDK's checkout"}
    try:
        import json

        direct = metadata.distribution("kvcodec-sdk").read_text("direct_url.json")
        commit = json.loads(direct).get("vcs_info", {}).get("commit_id") if direct else None
        if commit:
            return {"revision": commit, "dirty": None, "of": "the install's VCS record"}
    except Exception:
        pass
    found = _git_at(os.getcwd())
    return found | {"of": "the working directory's checkout"} if found is not None else None


def _storage(directory: str) -> dict[str, Any]:
    try:
        from ..storage_profile import probe_storage

        return asdict(probe_storage(directory))
    except Exception as exc:  # the record never fails the run
        return {"path": directory, "error": f"{type(exc).__name__}: {exc}"}


def record(*, device: str | None = None, storage_dir: str | None = None, started: str | None = None,
           seconds: float | None = None) -> dict[str, Any]:
    """The machine record (a JSON-serializable dict): ``device`` the benchmark ran on,
    ``storage_dir`` the directory a disk benchmark measured (its file system and device class are
    added), ``started`` / ``seconds`` when the run began (:func:`now`) and how long it took."""
    uname = platform.uname()
    out: dict[str, Any] = {
        "time": started or now(),
        "seconds": seconds,
        "device": device,
        "gpu": _gpu(device),
        "cpu": _cpu(),
        "memory_bytes": _memory_bytes(),
        "os": {"system": uname.system, "release": uname.release, "version": uname.version,
               "platform": platform.platform()},
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": _versions(),
        "plugins": _plugins(),
        "git": _git(),
    }
    if storage_dir is not None:
        out["storage"] = _storage(storage_dir)
    return out


def describe(m: dict[str, Any]) -> list[tuple[str, str]]:
    """The record as (what, value) lines for a summary: one line per part."""
    gpu = m.get("gpu") or {}
    if gpu.get("name"):
        mem = f", {gpu['memory_bytes'] / 2**30:.0f} GiB" if gpu.get("memory_bytes") else ""
        gpu_line = f"{gpu['name']} (sm {gpu.get('compute_capability', '?')}{mem})"
    else:
        gpu_line = f"none used ({gpu.get('device_count', 0)} CUDA device(s) seen)"
    drv = gpu.get("cuda_driver") or "none"
    cuda = f"driver {drv}" + (f", runtime {gpu['cuda_runtime']}" if gpu.get("cuda_runtime") else "")
    cpu = m.get("cpu") or {}
    mem = m.get("memory_bytes")
    git = m.get("git")
    versions = m.get("versions") or {}
    codecs = (m.get("plugins") or {}).get("codecs") or {}
    lines = [
        ("time", str(m.get("time"))),
        ("device", str(m.get("device"))),
        ("GPU", gpu_line),
        ("CUDA", cuda),
        ("CPU", f"{cpu.get('model')}, {cpu.get('logical_cores')} logical cores ({cpu.get('usable_cores')} usable)"),
        ("memory", f"{mem / 2**30:.1f} GiB" if mem else "unknown"),
        ("OS", f"{(m.get('os') or {}).get('system')} {(m.get('os') or {}).get('release')}"),
        ("Python", str(m.get("python"))),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "unknown"),
        ("codecs", ", ".join(f"{k} {v['version']} ({v['plugin']})" for k, v in codecs.items()) or "unknown"),
        ("git", f"{git['revision'][:12]}{' (modified)' if git.get('dirty') else ''}, {git['of']}" if git
         else "not run from a checkout"),
    ]
    st = m.get("storage")
    if st:
        lines.append(("storage", f"{st.get('device_class', '?')} ({st.get('fs_type') or '?'} at "
                                 f"{st.get('mount_point') or '?'}"
                                 + (f", {', '.join(st['block_devices'])}" if st.get("block_devices") else "") + ")"))
    if m.get("seconds") is not None:
        lines.append(("run took", f"{m['seconds']:.1f} s"))
    return lines
