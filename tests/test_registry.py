"""The codec registry: specs, parameter validation, devices, entry-point plugins and the plugin ABI.

Plugins are installed as fake distributions in ``tmp_path`` (a ``*.dist-info`` with an
``entry_points.txt`` in the ``kvcodec`` group plus the plugin module), found through ``sys.path``
by ``importlib.metadata`` exactly as an installed wheel would be.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
import textwrap
import types
import warnings

import numpy as np
import pytest
from sdk_helpers import pairs

import kvcodec_sdk
from kvcodec_sdk import (
    CodecParamError,
    CodecRegistry,
    CodecSpec,
    KvcodecError,
    ParamSpec,
    PluginAbiError,
    UnknownCodecError,
    _native,
)
from kvcodec_sdk.codecs import concat as concat_plugin

# Builds KvcodecCodecFactory structs with ctypes and wraps them in PyCapsules. The same source is
# used in-process (exec'd below) and written next to fake plugins, which import it.
ABI_HELPER_SOURCE = textwrap.dedent(
    '''
    import ctypes

    class KvcodecCodecFactory(ctypes.Structure):
        """Mirror of plugin.h's struct (40 bytes on LP64)."""
        _fields_ = [
            ("abiVersion", ctypes.c_uint32),
            ("structBytes", ctypes.c_uint32),
            ("name", ctypes.c_void_p),
            ("formatVersion", ctypes.c_uint32),
            ("reserved", ctypes.c_uint32),
            ("create", ctypes.c_void_p),
            ("destroy", ctypes.c_void_p),
        ]

    CAPSULE_NAME = b"kvcodec.codec_factory"
    _KEEP = []  # structs, names and capsule names referenced by raw pointers: never freed

    _new = ctypes.pythonapi.PyCapsule_New
    _new.restype = ctypes.py_object
    _new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    _get = ctypes.pythonapi.PyCapsule_GetPointer
    _get.restype = ctypes.c_void_p
    _get.argtypes = [ctypes.py_object, ctypes.c_char_p]

    def factory_of(capsule):
        """The KvcodecCodecFactory a capsule points at."""
        return KvcodecCodecFactory.from_address(_get(capsule, CAPSULE_NAME))

    def make_capsule(name=b"fake", abi=None, struct_bytes=None, format_version=1, create=None, destroy=None,
                     capsule_name=CAPSULE_NAME):
        """A capsule over a new factory; create/destroy default to null."""
        import kvcodec_sdk
        name_buf = ctypes.create_string_buffer(name)
        cap_name = ctypes.create_string_buffer(capsule_name)
        f = KvcodecCodecFactory(
            kvcodec_sdk.ABI_VERSION if abi is None else abi,
            ctypes.sizeof(KvcodecCodecFactory) if struct_bytes is None else struct_bytes,
            ctypes.addressof(name_buf), format_version, 0, create, destroy,
        )
        _KEEP.extend([f, name_buf, cap_name])
        return _new(ctypes.addressof(f), cap_name, None)

    def concat_clone(name=b"fake", format_version=1):
        """A working factory named `name` that reuses the built-in concat create/destroy."""
        from kvcodec_sdk import _native
        real = factory_of(_native.concat_factory())
        return make_capsule(name, format_version=format_version, create=real.create, destroy=real.destroy)
    '''
)

abi = types.ModuleType("kvcodec_test_abi_inprocess")
exec(ABI_HELPER_SOURCE, abi.__dict__)


def installed_codecs() -> list[str]:
    """Codec names a fresh registry finds in this environment (concat plus any installed plugins), so
    the tests below stay correct when real plugins are installed next to the SDK."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [s.name for s in CodecRegistry().list_codecs()]


def names(registry) -> list[str]:
    return [s.name for s in registry.list_codecs()]


# -- fake installed distributions -----------------------------------------------------------------


@pytest.fixture
def install_plugin(tmp_path, monkeypatch):
    """install_plugin(dist, ep_name, module, source): a fake distribution offering one entry point."""
    modules = {"fake_kvcodec_abi"}
    (tmp_path / "fake_kvcodec_abi.py").write_text(ABI_HELPER_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(dist: str, ep_name: str, module: str, source: str) -> None:
        info = tmp_path / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[kvcodec]\n{ep_name} = {module}\n")
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        modules.add(module)
        importlib.invalidate_caches()

    for name in modules:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield install
    for name in modules:
        sys.modules.pop(name, None)


PLUGIN_HEADER = """
import kvcodec_sdk
from kvcodec_sdk import CodecSpec, hookimpl, _native
import fake_kvcodec_abi as abi
"""


def plugin_registering(spec_expr: str) -> str:
    return PLUGIN_HEADER + textwrap.dedent(
        f"""
        SPEC = {spec_expr}

        @hookimpl
        def kvcodec_register_codecs(registry):
            registry.register(SPEC)
        """
    )


def fake_spec_expr(name: str, factory: str) -> str:
    return f"CodecSpec(name={name!r}, description='fake', version='1.0', format_version=1, lossless=True, factory={factory})"


# -- specs and lookups ----------------------------------------------------------------------------


def test_list_codecs_has_concat_with_its_spec():
    specs = kvcodec_sdk.list_codecs()
    assert [s.name for s in specs] == sorted(s.name for s in specs)
    concat = next(s for s in specs if s.name == "concat")
    assert concat is kvcodec_sdk.get_codec_spec("concat")
    assert concat.format_version == 1 == _native.factory_info(concat.factory())["format_version"]
    assert concat.lossless is True and concat.error_bound is None
    assert tuple(concat.devices) == ("cpu", "cuda")
    assert concat.plugin == "concat"
    assert concat.version == kvcodec_sdk.__version__
    assert [p.name for p in concat.params] == ["path", "sm_path_below_bytes", "copy_api"]
    defaults = concat.defaults()
    assert defaults == {p.name: p.default for p in concat.params}
    assert defaults["path"] == "auto" and defaults["copy_api"] == "auto"
    assert isinstance(defaults["sm_path_below_bytes"], int) and defaults["sm_path_below_bytes"] >= 0
    described = json.loads(json.dumps(concat.to_json()))
    assert described["name"] == "concat" and described["format_version"] == 1
    assert described["params"]["path"]["choices"] == ["auto", "copy_engine", "sm"]
    assert described["params"]["sm_path_below_bytes"] == {
        "type": "integer", "default": defaults["sm_path_below_bytes"], "doc": concat.params[1].doc, "minimum": 0,
        "maximum": 2**40, "affects_blob": False,
    }


def test_unknown_codec_lists_the_known_ones():
    with pytest.raises(UnknownCodecError) as info:
        kvcodec_sdk.get_codec_spec("nope")
    assert isinstance(info.value, LookupError) and isinstance(info.value, KvcodecError)
    known = installed_codecs()
    assert "concat" in known
    assert str(info.value) == "unknown codec 'nope'; known codecs: " + ", ".join(repr(n) for n in known)
    assert info.value.name == "nope" and info.value.known == known
    with pytest.raises(UnknownCodecError, match="'concat'"):
        kvcodec_sdk.create_codec("nope")


# -- parameters -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, fragments",
    [
        ({"bogus": 1}, ["'bogus'", "valid parameters: 'path', 'sm_path_below_bytes', 'copy_api'"]),
        ({"path": 3}, ["parameter 'path' is 3 (int)", "must be a string"]),
        ({"sm_path_below_bytes": "x"}, ["parameter 'sm_path_below_bytes' is 'x' (str)", "integer"]),
        ({"sm_path_below_bytes": True}, ["parameter 'sm_path_below_bytes' is True (bool)", "integer"]),
        ({"sm_path_below_bytes": 1.0}, ["parameter 'sm_path_below_bytes' is 1.0 (float)", "integer"]),
        ({"sm_path_below_bytes": -1}, ["parameter 'sm_path_below_bytes' is -1", "must be >= 0"]),
        ({"path": "fast"}, ["parameter 'path' is 'fast'", "valid values are 'auto', 'copy_engine', 'sm'"]),
        ({"copy_api": "dma"}, ["parameter 'copy_api' is 'dma'", "valid values are 'auto', 'batch', 'per_copy'"]),
        ({"path": None}, ["parameter 'path' is None", "string"]),
    ],
)
def test_bad_params_name_parameter_value_and_what_is_valid(params, fragments):
    with pytest.raises(CodecParamError) as info:
        kvcodec_sdk.create_codec("concat", params)
    assert isinstance(info.value, ValueError)
    assert "codec 'concat'" in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_params_must_be_a_mapping():
    with pytest.raises(CodecParamError, match="must be a mapping of name to value, got list"):
        kvcodec_sdk.create_codec("concat", [("path", "sm")])


def test_params_are_completed_with_defaults():
    spec = kvcodec_sdk.get_codec_spec("concat")
    with kvcodec_sdk.create_codec("concat", {"path": "sm"}) as codec:
        assert codec.params == {**spec.defaults(), "path": "sm"}
    with kvcodec_sdk.create_codec("concat", {}) as codec:
        assert codec.params == spec.defaults()
    assert json.loads(spec.params_json({"sm_path_below_bytes": 0})) == {
        "copy_api": "auto", "path": "auto", "sm_path_below_bytes": 0,
    }


def test_param_out_of_native_range_is_a_param_error():
    with pytest.raises(CodecParamError, match="sm_path_below_bytes"):
        kvcodec_sdk.create_codec("concat", {"sm_path_below_bytes": 2**64})


def test_param_spec_and_codec_spec_validation():
    with pytest.raises(TypeError, match="type must be one of int, float, str, bool"):
        ParamSpec("x", list, [], "doc")
    with pytest.raises(ValueError, match="lossy and must declare error_bound"):
        CodecSpec("lossy", "d", "1", 1, lossless=False, factory=_native.concat_factory)
    with pytest.raises(ValueError, match="declares a parameter twice"):
        CodecSpec("dup", "d", "1", 1, True, _native.concat_factory,
                  params=(ParamSpec("a", int, 0, "a"), ParamSpec("a", int, 1, "a")))
    fp = ParamSpec("ratio", float, 0.5, "r", minimum=0.0, maximum=1.0)
    assert fp.validate("c", 1) == 1.0 and isinstance(fp.validate("c", 1), float)
    with pytest.raises(CodecParamError, match="'ratio' is inf; it must be a finite number"):
        fp.validate("c", float("inf"))
    with pytest.raises(CodecParamError, match="'ratio' is 1.5; it must be <= 1.0"):
        fp.validate("c", 1.5)


# -- devices --------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["gpu", "CPU", "", "cuda:", "cuda:x", "cuda:-1", "cuda 0", -1, True, None, 1.5])
def test_bad_device_strings(device):
    with pytest.raises(ValueError, match="device is"):
        kvcodec_sdk.create_codec("concat", device=device)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:7", 0])
def test_cuda_is_refused_without_a_gpu(device):
    if _native.driver_info()["device_count"] > 0:
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ValueError, match=r"cannot create codec 'concat' on cuda:\d+: CUDA device \d+ is not available"):
        kvcodec_sdk.create_codec("concat", device=device)


def test_codec_without_a_cpu_implementation_is_refused_on_cpu():
    reg = CodecRegistry(load_entry_points=False, builtins=False)
    plugin = types.SimpleNamespace(
        kvcodec_register_codecs=kvcodec_sdk.hookimpl(
            lambda registry: registry.register(
                CodecSpec("concat", "cuda only", "1", 1, True, _native.concat_factory, devices=("cuda",))
            )
        )
    )
    reg.register_plugin(plugin, "cudaonly")
    with pytest.raises(ValueError, match="codec 'concat' has no cpu implementation; it runs on: cuda"):
        reg.create_codec("concat", device="cpu")
    assert reg.get_codec_spec("concat").plugin == "cudaonly"


# -- registry mechanics ---------------------------------------------------------------------------


def test_registry_without_builtins_or_entry_points_is_empty():
    reg = CodecRegistry(load_entry_points=False, builtins=False)
    assert reg.list_codecs() == []
    with pytest.raises(UnknownCodecError, match="none \\(no codec plugin is installed or enabled\\)"):
        reg.get_codec_spec("concat")


def test_register_plugin_after_load_and_register_non_spec():
    reg = CodecRegistry(load_entry_points=False)
    assert [s.name for s in reg.list_codecs()] == ["concat"]
    with pytest.raises(RuntimeError, match="plugin 'late' registered after the registry was loaded"):
        reg.register_plugin(concat_plugin, "late")
    with pytest.raises(TypeError, match="register\\(\\) takes a CodecSpec, got dict"):
        reg.register({"name": "x"})


def test_blocked_plugin_object_is_ignored(monkeypatch):
    monkeypatch.setenv("KVCODEC_DISABLE_PLUGINS", " other , mine,")
    reg = CodecRegistry(load_entry_points=False, builtins=False)
    assert reg.blocked == ["mine", "other"]
    reg.register_plugin(concat_plugin, "mine")
    assert reg.list_codecs() == []


def test_module_level_functions_use_a_resettable_default_registry():
    from kvcodec_sdk import registry

    first = registry.default_registry()
    assert registry.default_registry() is first
    registry._reset_default_registry()
    assert registry.default_registry() is not first


# -- entry-point plugins --------------------------------------------------------------------------


def test_entry_point_plugin_with_a_working_ctypes_factory(install_plugin, rng):
    before = installed_codecs()
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("fake", "abi.concat_clone")))
    reg = CodecRegistry()
    assert names(reg) == sorted(before + ["fake"])
    spec = reg.get_codec_spec("fake")
    assert spec.plugin == "fakecodec"
    assert reg.broken_plugins == {}
    assert "fake_kvcodec_plugin" in sys.modules
    with reg.create_codec("fake") as codec:
        assert codec.spec is spec
        hot = rng.integers(1, 256, size=(3, 5), dtype=np.uint8)
        codec.configure([kvcodec_sdk.PoolGroupDesc([kvcodec_sdk.PoolDesc(hot.ctypes.data, 5, 3)],
                                                   [kvcodec_sdk.LifeCycleDesc(0)])])
        cold = np.zeros((2, 5), np.uint8)
        codec.encode(0, cold, pairs([1, 0], [0, 2]))
        np.testing.assert_array_equal(cold, hot[[2, 0]])


def test_default_registry_loads_entry_points(install_plugin):
    before = installed_codecs()
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("fake", "abi.concat_clone")))
    assert [s.name for s in kvcodec_sdk.list_codecs()] == sorted(before + ["fake"])
    with kvcodec_sdk.create_codec("fake") as codec:
        assert codec._native.name == "fake"


def test_duplicate_codec_name_warns_naming_both_plugins(install_plugin):
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("concat", "_native.concat_factory")))
    reg = CodecRegistry()
    with pytest.warns(UserWarning) as record:
        specs = reg.list_codecs()
    messages = [str(w.message) for w in record]
    assert any(
        "codec 'concat' from plugin 'fakecodec' ignored: already registered by plugin 'concat'" in m for m in messages
    ), messages
    assert [s.name for s in specs].count("concat") == 1
    concat = reg.get_codec_spec("concat")
    assert concat == dataclasses.replace(concat_plugin.SPEC, plugin="concat")
    assert concat_plugin.SPEC.plugin == "", "the registry must not mutate the plugin's shared spec"
    assert "fakecodec" not in reg.broken_plugins


def test_spec_name_must_match_the_native_factory(install_plugin):
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("other", "_native.concat_factory")))
    reg = CodecRegistry()
    with pytest.warns(UserWarning, match="fakecodec"):
        assert "other" not in names(reg)
    message = reg.broken_plugins["fakecodec"]
    for fragment in ("'other'", "plugin 'fakecodec'", "native factory named 'concat'", "must agree"):
        assert fragment in message


def test_format_version_must_match_the_native_factory(install_plugin):
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("fake", "lambda: abi.concat_clone(format_version=2)")))
    reg = CodecRegistry()
    with pytest.warns(UserWarning, match="fakecodec"):
        listed = names(reg)
    assert "fake" not in listed and "concat" in listed
    assert re.search(r"codec 'fake' \(format 1\).*with format 2; they must agree", reg.broken_plugins["fakecodec"])


def test_failed_load_is_not_silently_half_loaded(install_plugin):
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("other", "_native.concat_factory")))
    reg = CodecRegistry()
    with pytest.warns(UserWarning, match="fakecodec"):
        first = names(reg)
    assert first == names(reg), "lookups after a failed registration must be stable"
    assert "other" not in first and "concat" in first
    assert "must agree" in reg.broken_plugins["fakecodec"]


def test_disable_plugins_blocks_an_entry_point(install_plugin, monkeypatch):
    before = installed_codecs()
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("fake", "abi.concat_clone")))
    monkeypatch.setenv("KVCODEC_DISABLE_PLUGINS", "fakecodec")
    reg = CodecRegistry()
    assert names(reg) == before
    assert "fake_kvcodec_plugin" not in sys.modules, "a blocked plugin must not even be imported"
    with pytest.raises(UnknownCodecError, match="unknown codec 'fake'; known codecs: .*'concat'"):
        reg.create_codec("fake")


def test_disable_plugins_hides_the_builtin(install_plugin, monkeypatch):
    before = installed_codecs()
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("fake", "abi.concat_clone")))
    monkeypatch.setenv("KVCODEC_DISABLE_PLUGINS", "concat")
    expected = sorted(set(before) - {"concat"} | {"fake"})
    assert [s.name for s in kvcodec_sdk.list_codecs()] == expected
    with pytest.raises(UnknownCodecError) as info:
        kvcodec_sdk.create_codec("concat")
    assert info.value.known == expected
    monkeypatch.setenv("KVCODEC_DISABLE_PLUGINS", "fakecodec,concat")
    assert "concat" not in names(CodecRegistry())
    monkeypatch.setenv("KVCODEC_DISABLE_PLUGINS", "concat")
    reg = CodecRegistry(load_entry_points=False)
    with pytest.raises(UnknownCodecError, match="known codecs: none"):
        reg.get_codec_spec("concat")


def test_broken_plugin_is_reported_and_others_still_load(install_plugin):
    before = installed_codecs()
    install_plugin("brokencodec", "brokencodec", "broken_kvcodec_plugin",
                   "raise ImportError('needs libfoo.so.3')\n")
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("fake", "abi.concat_clone")))
    reg = CodecRegistry()
    with pytest.warns(UserWarning, match=r"kvcodec plugin 'brokencodec' failed to load: "
                                         r"ImportError: needs libfoo.so.3 \(entry point broken_kvcodec_plugin\)"):
        found = names(reg)
    assert found == sorted(before + ["fake"])
    assert reg.broken_plugins["brokencodec"] == "ImportError: needs libfoo.so.3 (entry point broken_kvcodec_plugin)"


def test_entry_point_to_a_missing_module_is_broken(install_plugin, tmp_path):
    before = installed_codecs()
    install_plugin("ghostcodec", "ghost", "ghost_kvcodec_plugin", "")
    (tmp_path / "ghost_kvcodec_plugin.py").unlink()
    reg = CodecRegistry()
    with pytest.warns(UserWarning, match="kvcodec plugin 'ghost'"):
        broken = reg.broken_plugins
    assert broken["ghost"].startswith("ModuleNotFoundError")
    assert names(reg) == before


def test_abi_mismatched_plugin_is_refused_at_registration(install_plugin):
    before = installed_codecs()
    install_plugin("fakecodec", "fakecodec", "fake_kvcodec_plugin",
                   plugin_registering(fake_spec_expr("fake", "lambda: abi.make_capsule(b'fake', abi=999)")))
    reg = CodecRegistry()
    with pytest.warns(UserWarning, match="kvcodec plugin 'fakecodec' failed to load: ValueError: codec plugin ABI mismatch"):
        found = names(reg)
    assert found == before
    reason = reg.broken_plugins["fakecodec"]
    assert "999" in reason and f"ABI version {kvcodec_sdk.ABI_VERSION}" in reason


# -- the plugin ABI -------------------------------------------------------------------------------


def test_ctypes_mirror_matches_the_real_factory():
    import ctypes

    assert ctypes.sizeof(abi.KvcodecCodecFactory) == (40 if ctypes.sizeof(ctypes.c_void_p) == 8 else 28)
    real = abi.factory_of(_native.concat_factory())
    assert real.abiVersion == kvcodec_sdk.ABI_VERSION == _native.ABI_VERSION
    assert real.structBytes == ctypes.sizeof(abi.KvcodecCodecFactory)
    assert ctypes.string_at(real.name) == b"concat"
    assert real.formatVersion == 1 and real.reserved == 0 and real.create and real.destroy
    assert _native.FACTORY_CAPSULE_NAME == "kvcodec.codec_factory"
    assert _native.factory_info(_native.concat_factory()) == {
        "name": "concat", "format_version": 1, "abi_version": kvcodec_sdk.ABI_VERSION,
    }
    assert _native.factory_info(abi.concat_clone(b"clone", 3)) == {
        "name": "clone", "format_version": 3, "abi_version": kvcodec_sdk.ABI_VERSION,
    }


def _both_entry_points():
    return (
        ("factory_info", lambda cap: _native.factory_info(cap)),
        ("NativeCodec", lambda cap: _native.NativeCodec(cap, "{}", -1)),
    )


@pytest.mark.parametrize("entry", [e[1] for e in _both_entry_points()], ids=[e[0] for e in _both_entry_points()])
def test_abi_version_mismatch_names_both_versions(entry):
    capsule = abi.make_capsule(b"fake", abi=999)
    with pytest.raises(ValueError) as info:
        entry(capsule)
    message = str(info.value)
    assert "ABI mismatch" in message
    assert "ABI version 999" in message and f"ABI version {kvcodec_sdk.ABI_VERSION}" in message


def test_plugins_built_for_an_older_supported_abi_still_load():
    """ABI 2 appended decodeChecked() to the codec interface; plugins built for ABI 1 keep loading
    and working (the SDK never calls the methods their vtables lack); ABI 0 is refused."""
    real = abi.factory_of(_native.concat_factory())
    old = abi.make_capsule(b"old", abi=1, create=real.create, destroy=real.destroy)
    assert _native.factory_info(old)["abi_version"] == 1
    codec = _native.NativeCodec(old, "{}", -1)
    assert codec.abi_version == 1 and not codec.has_checked_decode
    codec.release()
    with pytest.raises(ValueError, match=r"ABI version 0, .* loads versions 1\.\."):
        _native.factory_info(abi.make_capsule(b"older", abi=0, create=real.create, destroy=real.destroy))


@pytest.mark.parametrize("entry", [e[1] for e in _both_entry_points()], ids=[e[0] for e in _both_entry_points()])
def test_struct_size_mismatch_names_both_sizes(entry):
    capsule = abi.make_capsule(b"fake", struct_bytes=48)
    with pytest.raises(ValueError, match=r"KvcodecCodecFactory is 48 bytes in the plugin but 40 bytes in this "
                                         rf"kvcodec_sdk \(ABI version {kvcodec_sdk.ABI_VERSION} has one size\)"):
        entry(capsule)


@pytest.mark.parametrize("entry", [e[1] for e in _both_entry_points()], ids=[e[0] for e in _both_entry_points()])
def test_incomplete_factory_is_refused(entry):
    with pytest.raises(ValueError, match="incomplete: name, create and destroy must all be set"):
        entry(abi.make_capsule(b"fake"))  # right version and size, null create/destroy


@pytest.mark.parametrize("entry", [e[1] for e in _both_entry_points()], ids=[e[0] for e in _both_entry_points()])
def test_capsule_with_another_name_or_a_non_capsule(entry):
    capsule = abi.make_capsule(b"fake", capsule_name=b"other.factory")
    with pytest.raises(TypeError, match="expected a PyCapsule named 'kvcodec.codec_factory', got one named "
                                        "'other.factory'"):
        entry(capsule)
    with pytest.raises(TypeError, match="expected a PyCapsule named 'kvcodec.codec_factory', got <class 'int'>"):
        entry(1234)


def test_create_codec_turns_a_late_abi_mismatch_into_plugin_abi_error():
    # The factory is checked at registration; a factory that changes afterwards is caught at creation.
    capsules = iter([abi.concat_clone(b"fake"), abi.make_capsule(b"fake", abi=999)])
    spec = CodecSpec("fake", "d", "1", 1, True, lambda: next(capsules))
    plugin = types.SimpleNamespace(kvcodec_register_codecs=kvcodec_sdk.hookimpl(lambda registry: registry.register(spec)))
    reg = CodecRegistry(load_entry_points=False)
    reg.register_plugin(plugin, "late")
    assert reg.get_codec_spec("fake").plugin == "late"
    with pytest.raises(PluginAbiError, match="999"):
        reg.create_codec("fake")


def test_factory_create_failure_is_reported_with_the_codec_name():
    with pytest.raises(ValueError, match="cannot create codec 'clone' on cpu: concat parameter 'path' is x"):
        _native.NativeCodec(abi.concat_clone(b"clone"), '{"path": "x"}', -1)
