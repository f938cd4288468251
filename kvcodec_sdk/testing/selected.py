"""The conformance suite over the codecs named by ``--kvcodec`` (collected by the ``kvcodec``
pytest plugin when asked; see :mod:`kvcodec_sdk.testing.plugin`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .plugin import selected_codecs
from .suite import CodecConformanceTests


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kvcodec_selection" in metafunc.fixturenames:
        chosen = selected_codecs(metafunc.config)
        ids = [name + (f"[{i}]" if params else "") for i, (name, params) in enumerate(chosen)]
        metafunc.parametrize("kvcodec_selection", chosen, ids=ids, scope="class")


class TestKvcodecConformance(CodecConformanceTests):
    @pytest.fixture
    def kvcodec_spec(self, kvcodec_selection):
        from ..registry import get_codec_spec

        return get_codec_spec(kvcodec_selection[0])

    @pytest.fixture
    def kvcodec_params(self, kvcodec_selection):
        return kvcodec_selection[1]

    @pytest.fixture
    def kvcodec_golden_dir(self, request, kvcodec_spec):
        from .golden import declared_vectors

        folder = f"{kvcodec_spec.name}-v{kvcodec_spec.format_version}"
        root = request.config.getoption("kvcodec_golden", default=None)
        if root is not None:
            return Path(root) / folder
        declared = declared_vectors(kvcodec_spec)
        if declared is None:
            pytest.skip(f"codec {kvcodec_spec.name!r} ships no golden vectors (declare them next to its spec: CodecSpec "
                        f"golden_vectors, a folder holding {folder}/; or give kvcodec check --golden DIR, pytest "
                        "--kvcodec-golden DIR)")
        return declared
