"""Documentation of the public API and of the plugin hooks, and that every hook is exercised."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

import kvcodec_sdk
from kvcodec_sdk import hookspecs
from kvcodec_sdk.codecs import concat as concat_plugin

SPEC_ATTR = f"{hookspecs.PROJECT_NAME}_spec"
IMPL_ATTR = f"{hookspecs.PROJECT_NAME}_impl"
HOOKS = sorted(name for name, obj in vars(hookspecs).items() if callable(obj) and hasattr(obj, SPEC_ATTR))
ROLE = re.compile(r":(?:class|meth|func|attr|exc|mod|data):`~?([\w.]+)`")


def test_there_are_hooks():
    assert HOOKS == ["kvcodec_register_codecs"]


@pytest.mark.parametrize("hook", HOOKS)
def test_hookspec_documents_every_argument(hook):
    func = getattr(hookspecs, hook)
    doc = inspect.getdoc(func)
    assert doc and len(doc.splitlines()[0]) > 10, f"{hook} needs a docstring with a summary line"
    args = list(inspect.signature(func).parameters)
    documented = re.findall(r":param (\w+):\s*\S", doc)
    assert sorted(documented) == sorted(args), f"{hook}: args {args}, documented {documented}"


def _resolve(target: str, owner) -> object:
    """Resolves a Sphinx cross-reference as written in ``owner``'s docstring."""
    module = inspect.getmodule(owner)
    candidates = [target]
    if module is not None:
        candidates.append(f"{module.__name__}.{target}")
        if inspect.isclass(owner):
            candidates.append(f"{module.__name__}.{owner.__qualname__}.{target}")
        elif "." in getattr(owner, "__qualname__", ""):
            candidates.append(f"{module.__name__}.{owner.__qualname__.rsplit('.', 1)[0]}.{target}")
    for dotted in candidates:
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return obj
    raise LookupError(target)


def _documented_objects():
    """Hookspecs, public names of kvcodec_sdk, and the public methods of its public classes."""
    out = [(f"hookspecs.{h}", getattr(hookspecs, h)) for h in HOOKS]
    for name in kvcodec_sdk.__all__:
        obj = getattr(kvcodec_sdk, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        out.append((name, obj))
        if inspect.isclass(obj) and obj.__module__.startswith("kvcodec_sdk"):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(func):
                    out.append((f"{name}.{attr}", func))
    return out


def test_public_names_resolve():
    for name in kvcodec_sdk.__all__:
        assert hasattr(kvcodec_sdk, name), f"kvcodec_sdk.__all__ lists {name!r}, which does not exist"
    assert len(set(kvcodec_sdk.__all__)) == len(kvcodec_sdk.__all__)


@pytest.mark.parametrize("name, obj", _documented_objects(), ids=[n for n, _ in _documented_objects()])
def test_public_api_is_documented(name, obj):
    doc = obj.__doc__  # not inspect.getdoc: an inherited docstring does not document a subclass
    assert doc and doc.strip(), f"{name} has no docstring"
    for target in ROLE.findall(doc):
        try:
            _resolve(target, obj)
        except LookupError:
            pytest.fail(f"{name}'s docstring refers to {target!r}, which does not resolve")


def test_module_docstrings():
    for module in ("kvcodec_sdk", "kvcodec_sdk.hookspecs", "kvcodec_sdk.registry", "kvcodec_sdk.codec",
                   "kvcodec_sdk.layout", "kvcodec_sdk.spec", "kvcodec_sdk.errors", "kvcodec_sdk.codecs.concat"):
        assert (importlib.import_module(module).__doc__ or "").strip(), module


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_implemented_by_a_builtin_plugin(hook):
    impl = getattr(concat_plugin, hook, None)
    assert impl is not None and hasattr(impl, IMPL_ATTR), f"no built-in plugin implements {hook}"
    spec_args = list(inspect.signature(getattr(hookspecs, hook)).parameters)
    assert list(inspect.signature(impl).parameters) == spec_args


def test_every_hook_is_called_by_the_registry():
    reg = kvcodec_sdk.CodecRegistry(load_entry_points=False)
    calls = []
    probe = type("Probe", (), {})()
    for hook in HOOKS:
        def record(registry, _hook=hook):
            calls.append((_hook, registry))
        record.__name__ = hook
        setattr(probe, hook, kvcodec_sdk.hookimpl(record))
    reg.register_plugin(probe, "probe")
    assert [s.name for s in reg.list_codecs()] == ["concat"]  # the concat plugin's hook registered it
    assert calls == [(hook, reg) for hook in HOOKS]
    reg.list_codecs()
    assert len(calls) == len(HOOKS), "hooks run once per registry"
