"""The conformance suite can fail: each deliberately broken codec of tests/broken_codecs is caught
by the test of the clause it breaks, with a message naming the clause and what went wrong; the
unbroken control passes everything.

libbroken_codecs is built once per session with CMake against the installed SDK (as an
out-of-tree plugin would be); each case runs the suite in-process with pytester.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import kvcodec_sdk
from kvcodec_sdk.testing import harness

HERE = Path(__file__).parent
BROKEN = HERE / "broken_codecs"

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


@pytest.fixture(scope="session")
def broken_lib(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("broken_build")
    configure = subprocess.run(
        ["cmake", "-S", str(BROKEN), "-B", str(build), f"-Dkvcodec_sdk_DIR={kvcodec_sdk.get_cmake_dir()}",
         "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    built = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    lib = next(build.glob("libbroken_codecs.*"))
    os.environ["KVCODEC_BROKEN_LIB"] = str(lib)
    return lib


def run_suite(pytester, flaw: str, *args: str, name: str | None = None, golden: Path | None = None,
              spec: str | None = None):
    """Runs CodecConformanceTests on one broken codec; returns {test name: failure text} and the
    outcome counts. ``spec`` is an expression of the test file's fixture (default
    ``broken.spec(flaw, name=name)``)."""
    pytester.syspathinsert(BROKEN)
    spec = spec or f"broken.spec({flaw!r}, name={name!r})"
    pytester.makepyfile(test_broken=textwrap.dedent(f"""
        import pytest
        import broken
        from kvcodec_sdk.testing import CodecConformanceTests

        class TestBroken(CodecConformanceTests):
            golden_vectors = {str(golden) if golden else None!r}

            @pytest.fixture
            def kvcodec_spec(self):
                return {spec}
    """))
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    reports = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when == "call" or r.failed]
    failures = {r.nodeid.split("::")[-1]: r.longreprtext for r in reports if r.failed}
    return failures, result.parseoutcomes()


# flaw -> (failing test, clause, text the message must contain)
CPU_CASES = {
    "configure_twice": ("test_configure_once[cpu]", "configure-once", "a second configure() returned true"),
    "unfixed_size": ("test_cold_size_fixed[cpu]", "cold-size-fixed", "it must be fixed"),
    "inconsistent_batching": ("test_batching_representative[cpu]", "batching-representative",
                              "the representative must map to itself"),
    "bad_location": ("test_index_location[cpu]", "index-location", "is kBadLocation for a configured lifecycle"),
    "lossy_claims_lossless": ("test_round_trip[cpu-mixed]", "round-trip", "declares itself lossless"),
    "decode_ignores_lifecycle": ("test_round_trip[cpu-mixed]", "round-trip", "should hold the page encoded from"),
    "nondeterministic": ("test_deterministic[cpu]", "deterministic", "encoding the same hot page twice"),
    "false_batching": ("test_batched_calls[cpu]", "batched-calls", "gave other blobs than separate calls"),
    "call_size_in_blob": ("test_chunked_calls[cpu]", "chunked-calls", "in chunks [0, 1, 4,"),
    "empty_fails": ("test_empty_call[cpu]", "empty-call", "0 pages, an empty index array) returned false"),
    "write_past_slot": ("test_writes_inside_slots[cpu-mixed]", "writes-inside-slots",
                        "byte(s) outside its destination blobs: first in blob"),
    "modifies_source": ("test_source_unmodified[cpu]", "source-unmodified", "modified its source"),
    "late_host_reads": ("test_host_indices_after_return[cpu]", "host-indices-after-return",
                        "overwritten right after its call returned"),
    "accepts_unknown_lifecycle": ("test_bad_arguments[cpu]", "bad-arguments", "unknown lifecycle 99991 returned true"),
    "wrong_pool_bound": ("test_bad_arguments[cpu]", "bad-arguments", "returned true; invalid arguments must return false"),
}


@pytest.mark.parametrize("flaw", sorted(CPU_CASES))
def test_broken_codec_is_caught(pytester, broken_lib, flaw):
    test, clause, text = CPU_CASES[flaw]
    failures, _ = run_suite(pytester, flaw, "-k", "cpu and not golden")
    assert test in failures, f"{flaw}: {test} did not fail; failures: {sorted(failures)}"
    assert f"ClauseViolation: {clause}: " in failures[test], failures[test][-2000:]
    assert text in failures[test], failures[test][-2000:]


# Codecs that pass every clause the suite had before its stronger checks: each is caught by the
# check made for it, and by nothing else (ALSO names a broader check that catches it too).
# flaw -> (failing test, clause, text every failure's message contains)
NEW_CPU_CASES = {
    "uninit_padding": ("test_deterministic[cpu]", "deterministic", "pre-filled with 0x00 gave another blob than "
                                                                   "into one holding random bytes"),
    "partial_configure": ("test_rejected_configure[cpu]", "rejected-configure",
                          "a rejected configuration must leave every query failing"),
    "stale_cache": ("test_stateful_sequence[cpu]", "stateful-sequence", "should hold the page encoded at step"),
    "retains_sources": ("test_data_not_retained[cpu]", "data-not-retained",
                        "later calls wrote into the cold buffer of an earlier, completed encode"),
    "cpu_needs_null_stream": ("test_cpu_synchronous[cpu]", "cpu-synchronous", "a CPU reference ignores the stream"),
    "envelope_raw_bytes": ("test_envelope[cpu]", "envelope", "rawBytes is 16422, but the decoded page has 16421 bytes"),
    "envelope_uncovered": ("test_envelope[cpu]", "envelope", "outside what the CRCs cover, yet damaging them changed "
                                                             "the decoded page"),
    "checked_skips_checksum": ("test_checked_decode[cpu]", "checked-decode",
                               "flipped but decodeChecked() reported status 0 (kPageOk) for it"),
    "follows_caller_fp": ("test_fp_environment[cpu]", "fp-environment",
                          "encoded to other blobs with flush-to-zero, denormals-are-zero and rounding toward zero"),
}
ALSO = {"retains_sources": {"test_stateful_sequence[cpu]"}}  # a retained source also breaks a long sequence


@pytest.mark.parametrize("flaw", sorted(NEW_CPU_CASES))
def test_stronger_check_catches_what_nothing_else_does(pytester, broken_lib, flaw):
    test, clause, text = NEW_CPU_CASES[flaw]
    failures, _ = run_suite(pytester, flaw, "-k", "cpu and not golden")
    assert test in failures, f"{flaw}: {test} did not fail; failures: {sorted(failures)}"
    assert f"ClauseViolation: {clause}: " in failures[test], failures[test][-2000:]
    assert text in failures[test], failures[test][-2000:]
    assert set(failures) <= {test} | ALSO.get(flaw, set()), f"{flaw}: other tests failed too: {sorted(failures)}"


def test_descriptors_read_after_configure_are_caught(pytester, broken_lib):
    """keeps_descriptors reads pool bases from configure()'s arrays at every call. Only the test
    that configures through arrays it keeps alive runs here: elsewhere those arrays are freed and
    the codec reads freed memory."""
    failures, outcomes = run_suite(pytester, "keeps_descriptors", "-k", "descriptors_copied and cpu")
    message = failures["test_descriptors_copied[cpu]"]
    assert "ClauseViolation: descriptors-copied: after configure()'s descriptor arrays were overwritten" in message
    control, _ = run_suite(pytester, "none", "-k", "descriptors_copied and cpu")
    assert control == {}


# Lossy specs whose check_error is wrong (tests/broken_codecs/broken.py: LOSSY). Every failure
# comes from the suite's independent judgement, none from the codec's own check.
LOSSY_CASES = {
    # zeroes every other fp8 element; its check takes a zero for an underflow
    "zeroes_fp8": ("test_round_trip[cpu-mixed]", "is not an approximation of the original by the suite's own check"),
    # changes opaque K/V buffers; its check lets opaque buffers change
    "changes_opaque": ("test_round_trip[cpu-tiny-odd]", "opaque buffers (no tokens/heads/head dim) must be restored "
                                                        "exactly"),
    # an exact codec whose check reads fp8 buffers as 16-bit words (the low byte may change)
    "checker_blind_to_dtype": ("test_round_trip[cpu-mixed]", "check_error accepts a copy of the buffer whose element"),
}


@pytest.mark.parametrize("name", sorted(LOSSY_CASES))
def test_lossy_codec_is_judged_by_the_suite_not_only_by_its_check(pytester, broken_lib, name):
    test, text = LOSSY_CASES[name]
    failures, _ = run_suite(pytester, name, "-k", "cpu and not golden", spec=f"broken.lossy_spec({name!r})")
    assert test in failures, f"{name}: {test} did not fail; failures: {sorted(failures)}"
    assert "ClauseViolation: round-trip: " in failures[test], failures[test][-2000:]
    for other, message in failures.items():
        assert text in message, f"{name}: {other} failed for another reason: {message[-1500:]}"


def test_enveloped_control_passes_everything(pytester, broken_lib):
    failures, outcomes = run_suite(pytester, "envelope", "-k", "cpu and not golden")
    assert failures == {}
    assert outcomes.get("passed", 0) >= 20
    # It implements checked decode correctly, so that clause runs and passes (it can pass).
    failures, outcomes = run_suite(pytester, "envelope", "-k", "checked_decode and cpu")
    assert failures == {} and outcomes.get("passed", 0) == 1 and not outcomes.get("skipped"), outcomes


def test_write_past_slot_message_locates_the_byte(pytester, broken_lib):
    failures, _ = run_suite(pytester, "write_past_slot", "-k", "writes_inside_slots and cpu")
    message = failures["test_writes_inside_slots[cpu-mixed]"]
    # The first stray byte is the one right after a destination blob; one per blob of the call.
    assert "encode wrote 6 byte(s) outside its destination blobs" in message, message[-1500:]
    assert "1 byte(s) after destination blob" in message, message[-1500:]


@pytest.fixture
def broken(pytester, broken_lib):
    """The tests/broken_codecs/broken.py helper module."""
    pytester.syspathinsert(BROKEN)
    import broken

    return broken


def test_unbroken_control_passes_everything(pytester, broken, tmp_path):
    vectors = kvcodec_sdk.testing.write_golden_vectors(broken.spec("none"), tmp_path)
    assert (vectors / "manifest.json").is_file()
    with pytest.raises(FileExistsError):
        kvcodec_sdk.testing.write_golden_vectors(broken.spec("none"), tmp_path)
    failures, outcomes = run_suite(pytester, "none", "-k", "cpu", golden=tmp_path)
    assert failures == {}
    assert outcomes.get("passed", 0) >= 16 and "errors" not in outcomes and "failed" not in outcomes


def test_changed_format_fails_the_golden_vectors(pytester, broken, tmp_path):
    kvcodec_sdk.testing.write_golden_vectors(broken.spec("none"), tmp_path)
    # false_batching XORs every blob byte with a per-lifecycle key: same size, other format.
    failures, _ = run_suite(pytester, "false_batching", "-k", "golden and cpu", name="none", golden=tmp_path)
    message = failures["test_golden_vectors[cpu]"]
    assert "golden-vectors: none-v1 group 0" in message and "no longer gives the stored page" in message


def test_golden_vectors_declared_next_to_the_spec_run_by_default(pytester, broken, tmp_path):
    kvcodec_sdk.testing.write_golden_vectors(broken.spec("none"), tmp_path)
    # No golden_vectors on the class: the spec's declaration is used.
    spec = f"broken.spec('none', golden_vectors={str(tmp_path)!r})"
    failures, outcomes = run_suite(pytester, "none", "-k", "golden and cpu", spec=spec)
    assert failures == {} and outcomes.get("passed") == 1, outcomes
    # The same vectors against a codec whose format changed.
    spec = f"broken.spec('false_batching', name='none', golden_vectors={str(tmp_path)!r})"
    failures, _ = run_suite(pytester, "none", "-k", "golden and cpu", spec=spec)
    assert "no longer gives the stored page" in failures["test_golden_vectors[cpu]"]
    # A declaration without vectors of the current format version fails.
    spec = f"broken.spec('none', name='other', golden_vectors={str(tmp_path)!r})"
    failures, _ = run_suite(pytester, "none", "-k", "golden and cpu", spec=spec)
    assert "golden-vectors: no golden vectors at" in failures["test_golden_vectors[cpu]"]


def test_missing_codec_fixture_says_what_to_provide(pytester):
    pytester.makepyfile(test_empty="""
        from kvcodec_sdk.testing import CodecConformanceTests
        class TestNothing(CodecConformanceTests):
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "configure_once and cpu")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*NotImplementedError: TestNothing does not say which codec to test: set codec_name*"])


GPU_CASES = {
    "sync_stream": ("test_stream_no_wait[cuda]", "stream-no-wait", "did not return within"),
    "other_stream": ("test_stream_ordered[cuda]", "stream-ordered", "while earlier work on its stream was still pending"),
    "gpu_format_differs": ("test_cpu_gpu_interchange[cuda]", "cpu-gpu-interchange", "decoded on cpu"),
    "late_host_reads": ("test_host_indices_after_return[cuda]", "host-indices-after-return",
                        "overwritten right after its call returned"),
    "wrong_pool_bound": ("test_bad_arguments[cuda]", "bad-arguments", "returned true; invalid arguments must return false"),
}


@pytest.mark.gpu
@pytest.mark.skipif(not harness.cuda_available(), reason="needs a CUDA device and cuda-python")
@pytest.mark.parametrize("flaw", sorted(GPU_CASES))
def test_broken_cuda_codec_is_caught(pytester, broken_lib, flaw):
    test, clause, text = GPU_CASES[flaw]
    failures, _ = run_suite(pytester, flaw, "-k", test.split("[")[0] + " and cuda")
    assert test in failures, f"{flaw}: {test} did not fail; failures: {sorted(failures)}"
    assert f"ClauseViolation: {clause}: " in failures[test], failures[test][-2000:]
    assert text in failures[test], failures[test][-2000:]


def _lsb_bound(original, decoded, buffer, params):
    """check_error of a codec that may clear bit 0 of each 16-bit element (its low byte)."""
    diff = original.astype(int) - decoded.astype(int)
    if not diff.any():
        return None
    if buffer.dtype.itemsize != 2 or (diff[1::2] != 0).any() or (abs(diff) > 1).any():
        return f"{int((diff != 0).sum())} bytes differ beyond the low bit"
    return None


@pytest.mark.parametrize("check_error, fails", [(_lsb_bound, False), (None, True),
                                                (lambda o, d, b, p: "too far" if (o != d).any() else None, True)],
                         ids=["bound-holds", "no-check_error", "bound-exceeded"])
def test_lossy_codec_is_checked_against_its_declared_bound(pytester, broken, check_error, fails):
    """The same codec that fails as 'lossless' passes as lossy with a check_error that admits its
    loss, and fails without one or with a tighter one."""
    import dataclasses

    spec = dataclasses.replace(broken.spec("lossy_claims_lossless", lossless=False), check_error=check_error,
                               error_bound="low bit of 16-bit elements")
    broken.SPECS = {"lossy": spec}
    pytester.makepyfile(test_lossy="""
        import pytest, broken
        from kvcodec_sdk.testing import CodecConformanceTests
        class TestLossy(CodecConformanceTests):
            @pytest.fixture
            def kvcodec_spec(self):
                return broken.SPECS["lossy"]
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "round_trip and cpu-mixed")
    if fails:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*ClauseViolation: round-trip: *"])
    else:
        result.assert_outcomes(passed=1)


def test_check_error_must_be_callable():
    from kvcodec_sdk import CodecSpec

    with pytest.raises(TypeError, match="check_error must be callable"):
        CodecSpec(name="x", description="", version="0", format_version=1, lossless=False, factory=lambda: None,
                  error_bound="|x-y| <= 1", check_error="abs")
