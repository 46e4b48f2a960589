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
