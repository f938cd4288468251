"""What the manager's CUDA tests need from a GPU framework, twice: on cuda-python alone
(kvcodec_sdk.gpu, the pools as DeviceArray) and on torch (the pools as tensors). A test that takes
the ``kit`` fixture runs on both; the torch variant skips where torch with CUDA is missing, so the
cuda-core variant alone proves the manager on the GPU without torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcodec_sdk import _native, gpu

#: The legacy default stream's handle (cudaStreamLegacy).
LEGACY_STREAM = 1


class CoreKit:
    framework = "cuda"

    def __init__(self) -> None:
        self._keep: list[Any] = []

    def stream(self) -> Any:
        return gpu.new_stream("cuda:0")

    def write(self, view: Any, data: np.ndarray, stream: Any) -> None:
        """Queues a copy of host bytes into ``view`` on ``stream`` (``data`` is kept alive)."""
        data = np.ascontiguousarray(data, dtype=np.uint8)
        self._keep.append(data)
        view.copy_from(data, stream)

    def fill(self, view: Any, byte: int, stream: Any) -> None:
        view.fill_bytes(byte, stream)

    def zero_pools(self, pools: list) -> None:
        for pool in pools:
            pool.fill_bytes(0)

    def delay(self, stream: Any, seconds: float) -> None:
        """Holds ``stream`` for ``seconds``: later work on it waits. A native thread releases it,
        so an SDK call that waits for the stream while holding the interpreter lock still ends."""
        blocker = _native.StreamBlocker(gpu.stream_handle(stream))
        blocker.release_after(int(seconds * 1000))
        self._keep.append(blocker)

    def idle(self, stream: Any) -> bool:
        return gpu.stream_done(stream)

    def sync(self, stream: Any = None) -> None:
        gpu.synchronize(stream)

    def close(self) -> None:
        gpu.synchronize()
        self._keep.clear()


class TorchKit:
    framework = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def stream(self) -> Any:
        return self.torch.cuda.Stream()

    def write(self, view: Any, data: np.ndarray, stream: Any) -> None:
        with self.torch.cuda.stream(stream):
            view.copy_(self.torch.from_numpy(np.ascontiguousarray(data, dtype=np.uint8)).view(view.shape).to("cuda"))

    def fill(self, view: Any, byte: int, stream: Any) -> None:
        with self.torch.cuda.stream(stream):
            view.fill_(byte)

    def zero_pools(self, pools: list) -> None:
        for pool in pools:
            pool.zero_()
        self.torch.cuda.synchronize()

    def delay(self, stream: Any, seconds: float) -> None:
        s = self.torch.cuda.default_stream() if stream == LEGACY_STREAM else stream
        with self.torch.cuda.stream(s):
            self.torch.cuda._sleep(int(seconds * 2e9))  # about 2 GHz of cycles

    def idle(self, stream: Any) -> bool:
        return stream.query()

    def sync(self, stream: Any = None) -> None:
        if stream is None:
            self.torch.cuda.synchronize()
        else:
            stream.synchronize()

    def close(self) -> None:
        self.torch.cuda.synchronize()


@pytest.fixture(params=["cuda-core", "torch"])
def kit(request):
    if request.param == "torch":
        torch = pytest.importorskip("torch", exc_type=ImportError)
        if not torch.cuda.is_available():
            pytest.skip("torch without CUDA")
        k = TorchKit(torch)
    else:
        k = CoreKit()
    yield k
    k.close()
