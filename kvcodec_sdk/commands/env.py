"""``kvcodec env``: what a bug report needs to know about this machine and installation.

The SDK, its plugin ABI, Python and the platform, the CPU, the CUDA driver as the SDK sees it
(version, devices, batched-copy support), the GPUs (through cuda-python, else torch), whether the
GPU tooling (:mod:`kvcodec_sdk.gpu`, the ``gpu`` extra) can run, the versions of the packages the SDK and its plugins use, and every registered codec with
its plugin. ``--json`` prints the same as one object. Nothing here needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import warnings
from importlib import metadata, util
from typing import Any

from . import _ui

NAME = "env"
HELP = "report versions, driver, GPUs and codec plugins (for bug reports)"

#: Distributions reported when installed (name as on the package index).
PACKAGES = ["kvcodec-sdk", "kvcodec-fp8", "kvcodec-nvcomp", "numpy", "pluggy", "torch", "cuda-python",
            "cuda-core", "cuda-bindings", "cupy-cuda13x", "nvidia-libnvcomp-cu13", "lz4", "ml_dtypes",
            "cookiecutter", "scikit-build-core", "pybind11", "pytest", "hypothesis"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object instead of the text report")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver() -> dict[str, Any]:
    from .. import _native

    info = dict(_native.driver_info())
    v = int(info.get("driver_version", 0))
    info["driver_version"] = f"{v // 1000}.{v % 1000 // 10}" if v else "none (no CUDA driver found)"
    return info


def _gpus() -> list[str] | str:
    """Device names from cuda-python (cuda.core), else from torch, else unknown."""
    if util.find_spec("cuda") is not None and util.find_spec("cuda.core") is not None:
        try:
            from cuda.core import Device

            from .. import _native

            if int(_native.driver_info()["device_count"]) == 0:
                return []
            return [f"{d.device_id}: {d.name} (sm_{d.compute_capability.major}{d.compute_capability.minor})"
                    for d in Device.get_all_devices()]
        except Exception as exc:  # a broken install must not break the report
            return f"unknown (cuda.core failed: {exc})"
    if util.find_spec("torch") is None:
        return "unknown (names come from cuda-python or torch; neither is installed)"
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        return [f"{i}: {torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
                for i in range(torch.cuda.device_count())]
    except Exception as exc:  # a broken torch must not break the report
        return f"unknown (torch failed: {exc})"


def gpu_tooling() -> str:
    """Whether the SDK's GPU tooling (:mod:`kvcodec_sdk.gpu`: conformance on CUDA, ``kvcodec bench
    concat``, the manager's device pools without torch) can run, and with what."""
    from .. import _native, gpu

    build = int(_native.driver_info().get("cuda_build", 0)) // 1000
    try:
        bindings = metadata.version("cuda-bindings")
        core = metadata.version("cuda-core")
    except metadata.PackageNotFoundError:
        return f"not installed: {gpu.INSTALL_HINT}"
    if build and int(bindings.split(".")[0]) != build:
        return (f"cuda-bindings {bindings} is for CUDA {bindings.split('.')[0]}, the SDK is built for CUDA {build}: "
                f"{gpu.INSTALL_HINT}")
    why = gpu.unavailable_reason()
    state = "ready" if why is None else f"installed, not usable here ({why})"
    return f"{state}: cuda-core {core}, cuda-bindings {bindings}"


def _packages() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    if "torch" in out:
        try:
            import torch

            out["torch"] += f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (CPU build)"
        except Exception:
            pass
    return out


def _codecs() -> tuple[list[dict[str, Any]], dict[str, str]]:
    from ..registry import default_registry

    registry = default_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # broken plugins are reported below
        specs = registry.list_codecs()
        broken = dict(registry.broken_plugins)
    return [{"name": s.name, "version": s.version, "format_version": s.format_version, "plugin": s.plugin,
             "devices": list(s.devices)} for s in specs], broken


def collect() -> dict[str, Any]:
    """The report as a dict (what ``kvcodec env --json`` prints)."""
    from .. import ABI_VERSION, __version__

    codecs, broken = _codecs()
    return {
        "kvcodec_sdk": __version__,
        "plugin_abi": int(ABI_VERSION),
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "cpu": f"{_cpu()}, {os.cpu_count()} logical cores",
        "cuda_driver": _driver(),
        "gpus": _gpus(),
        "gpu_tooling": gpu_tooling(),
        "packages": _packages(),
        "codecs": codecs,
        "broken_plugins": broken,
    }


def run(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    d = report["cuda_driver"]
    gpus = report["gpus"]
    lines = [
        ("kvcodec_sdk", f"{report['kvcodec_sdk']} (plugin ABI {report['plugin_abi']})"),
        ("python", report["python"]),
        ("platform", report["platform"]),
        ("cpu", report["cpu"]),
        ("cuda driver", f"{d['driver_version']}, {d['device_count']} device(s), batched copies: {d['memcpy_batch'] or 'no'}"),
        ("gpus", ", ".join(gpus) if isinstance(gpus, list) and gpus else (gpus or "none")),
        ("gpu tooling", report["gpu_tooling"]),
    ]
    if _ui.rich_stdout():
        _print_rich(report, lines)
        return 0
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k:<{width}}  {v}")
    print("packages")
    for name, version in report["packages"].items():
        print(f"  {name:<24}{version}")
    print("codecs")
    for c in report["codecs"]:
        print(f"  {c['name']:<24}{c['version']} (format {c['format_version']}, plugin {c['plugin']}, "
              f"{','.join(c['devices'])})")
    for name, reason in report["broken_plugins"].items():
        print(f"  broken plugin {name!r}: {reason}")
    return 0


def _print_rich(report: dict[str, Any], lines: list[tuple[str, str]]) -> None:
    """The text report as terminal tables: the machine, the packages, the codecs."""
    out = _ui.console()
    out.print(_ui.rich_table(["", ""], [list(kv) for kv in lines]))
    out.print(_ui.rich_table(["package", "version"], [[k, v] for k, v in report["packages"].items()]))
    out.print(_ui.rich_table(["codec", "version", "format", "plugin", "devices"],
                             [[c["name"], c["version"], str(c["format_version"]), c["plugin"], ",".join(c["devices"])]
                              for c in report["codecs"]]))
    for name, reason in report["broken_plugins"].items():
        out.print(_ui.styled(f"broken plugin {name!r}: {reason}"))
