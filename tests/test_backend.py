import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tractlens.gpu import backend as be
from tractlens.gpu.backend import Backend, BackendError, Cancelled, OutOfDeviceMemory, get_backend, run_batched


def test_cpu_backend_uses_numpy():
    cpu = get_backend("cpu")
    assert cpu.xp is np
    assert not cpu.is_gpu
    assert cpu.free_memory_bytes() > 0


def test_unknown_device_is_a_clear_error():
    with pytest.raises(BackendError, match="unknown device 'tpu'"):
        get_backend("tpu")


def test_forced_gpu_without_device_names_the_reason(monkeypatch):
    monkeypatch.setenv("TRACTLENS_DISABLE_GPU", "1")
    be.gpu_status.cache_clear()
    try:
        with pytest.raises(BackendError, match=r"TRACTLENS_DISABLE_GPU.*--device cpu"):
            get_backend("gpu")
        assert get_backend("auto").name == "cpu"
    finally:
        be.gpu_status.cache_clear()


class FakeBackend(Backend):
    """CPU backend with a fixed amount of 'free memory' for batch-size tests."""

    def __new__(cls, free):
        obj = super().__new__(cls)
        return obj

    def __init__(self, free):
        object.__setattr__(self, "name", "cpu")
        object.__setattr__(self, "xp", np)
        object.__setattr__(self, "device_name", "fake")
        object.__setattr__(self, "_free", free)

    def free_memory_bytes(self):
        return self._free


def test_batch_size_follows_free_memory():
    fake = FakeBackend(free=1000)
    assert fake.batch_size(10_000, 10, fraction=0.5) == 50
    assert fake.batch_size(20, 10, fraction=0.5) == 20
    assert fake.batch_size(0, 10) == 0
    assert fake.batch_size(10_000, 10_000) == 1  # never zero


def test_out_of_memory_halves_the_batch_and_finishes():
    fake = FakeBackend(free=10_000)  # plans batches of 500
    done = np.zeros(1000, dtype=int)
    sizes = []

    def process(start, stop):
        if stop - start > 120:
            raise MemoryError("simulated")
        sizes.append(stop - start)
        done[start:stop] += 1

    run_batched(fake, 1000, 10, process)
    assert (done == 1).all()  # every item exactly once, none lost, none repeated
    assert max(sizes) <= 120 and max(sizes) >= 60


def test_out_of_memory_at_one_item_gives_up_clearly():
    fake = FakeBackend(free=10_000)

    def process(start, stop):
        raise MemoryError("simulated")

    with pytest.raises(OutOfDeviceMemory, match="even for one item"):
        run_batched(fake, 10, 1000, process)


def test_cancel_stops_between_batches_and_keeps_done_work():
    fake = FakeBackend(free=2_000)  # batches of 100
    done = []
    with pytest.raises(Cancelled):
        run_batched(fake, 1000, 10, lambda a, b: done.append((a, b)), cancelled=lambda: len(done) >= 3)
    assert done == [(0, 100), (100, 200), (200, 300)]


def test_progress_reports_every_batch():
    fake = FakeBackend(free=2_000)
    seen = []
    run_batched(fake, 250, 10, lambda a, b: None, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(100, 250), (200, 250), (250, 250)]


@pytest.mark.gpu
def test_gpu_backend_reports_device_and_memory():
    gpu = get_backend("gpu")
    assert gpu.is_gpu
    assert gpu.total_memory_bytes() > gpu.free_memory_bytes() * 0.5 > 0
    x = gpu.asarray(np.arange(5.0))
    np.testing.assert_array_equal(gpu.to_host(x * 2), np.arange(5.0) * 2)


class _FakeCupy:
    """What gpu_status touches of CuPy: its accelerator switches, the device, a tiny kernel."""

    def __init__(self, calls: list):
        self.calls = calls
        self.reduction, self.routine = [1], [1]  # CuPy's default: CUPY_ACCELERATORS=cub (1)
        self._core = SimpleNamespace(
            get_reduction_accelerators=lambda: list(self.reduction),
            set_reduction_accelerators=self._set_reduction,
            get_routine_accelerators=lambda: list(self.routine),
        )
        runtime = SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda i: {"name": b"Fake GPU"})
        self.cuda = SimpleNamespace(runtime=runtime, Device=lambda *a: SimpleNamespace(id=0))
        self.float32 = np.float32

    def _set_reduction(self, accelerators):
        self.calls.append("reduction accelerators")
        self.reduction = list(accelerators)

    def arange(self, *args, **kwargs):
        calls = self.calls

        class Kernel:
            def __mul__(self, other):
                calls.append("first kernel")
                return self

            def sum(self):
                return self

            def item(self):
                return 0.0

        return Kernel()


def test_the_engine_turns_off_cupys_block_reductions_before_any_kernel(monkeypatch):
    """A reduction then compiles one kernel whatever its data's size (CuPy's CUB block reduction
    compiles one per block size, taken from the length of the reduced run); CuPy's device-wide CUB
    routines (compiled into CuPy) stay on."""
    calls: list[str] = []
    fake = _FakeCupy(calls)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.delenv(be.ENV_CUB_BLOCK_REDUCTION, raising=False)
    monkeypatch.setattr(be, "_cupy_import_hooks", [lambda cupy: calls.append("start-up hook")])
    be.gpu_status.cache_clear()
    try:
        assert be.gpu_status() == (True, "Fake GPU")
    finally:
        be.gpu_status.cache_clear()
    assert calls == ["reduction accelerators", "start-up hook", "first kernel"]
    assert fake.reduction == [] and fake.routine == [1]


def test_cupys_block_reductions_can_be_kept(monkeypatch):
    fake = _FakeCupy([])
    monkeypatch.setenv(be.ENV_CUB_BLOCK_REDUCTION, "1")
    be._one_kernel_per_reduction(fake)
    assert fake.reduction == [1]
    monkeypatch.setenv(be.ENV_CUB_BLOCK_REDUCTION, "0")
    fake.reduction = [2, 1]  # cuTENSOR stays
    be._one_kernel_per_reduction(fake)
    assert fake.reduction == [2]
