"""The pieces of a shared run that join the devices' work (gpu.multidevice_copy), on simulated
GPUs (NumPy backends named like GPUs): the field uploaded in parts and gathered, the totals
handed in and added on the host as each device finishes, and a device finishing early while a
failure elsewhere gives work back."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tractlens.gpu.multidevice import run_shared, simulated_backends
from tractlens.gpu.multidevice_copy import HostSums, ShardedUpload, part_bounds


@pytest.mark.parametrize("nbytes,parts", [(0, 3), (5, 4), (1000, 1), (1000, 3), (1 << 20, 4), (1234567, 7)])
def test_parts_cover_every_byte_once_in_order(nbytes, parts):
    bounds = part_bounds(nbytes, parts)
    assert len(bounds) == parts
    covered = [i for a, b in bounds for i in range(a, b)]
    assert covered == list(range(nbytes))
    assert all(a % 256 == 0 for a, b in bounds if b > a)
    sizes = [b - a for a, b in bounds]
    if nbytes >= 256 * parts:
        assert max(sizes) - min(sizes) <= 2 * 256  # the alignment moves each cut by less than 256


def _field(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((301, 7, 3)).astype(np.float32), rng.random(1000).astype(np.float32),
            np.arange(-5, 995, dtype=np.int32).reshape(10, 10, 10))  # fmt: skip


def _fill_all(upload, backends, skip=()):
    out = [None] * len(backends)
    barrier = threading.Barrier(len(backends) - len(skip), timeout=10)

    def one(i):
        arrays = upload.allocate(backends[i])
        barrier.wait()  # every share uploads at once
        upload.fill(backends[i], i, arrays)
        out[i] = arrays

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(backends)) if i not in skip]
    for i in skip:
        upload.give_up(i)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("n", [1, 2, 4])
def test_every_share_ends_with_the_whole_field(n):
    host = _field()
    upload = ShardedUpload(host, n)
    for arrays in _fill_all(upload, simulated_backends(n)):
        for got, want in zip(arrays, host, strict=True):
            assert got is not want and got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    assert all(set(s) == {"upload", "gather_wait", "gather"} for s in upload.seconds)


def test_a_share_that_gives_up_has_its_part_taken_from_the_host():
    host = _field(1)
    upload = ShardedUpload(host, 3)
    t0 = time.perf_counter()
    out = _fill_all(upload, simulated_backends(3), skip=(1,))
    assert time.perf_counter() - t0 < 5  # nobody waited for share 1's part
    for i in (0, 2):
        for got, want in zip(out[i], host, strict=True):
            np.testing.assert_array_equal(got, want)


def test_host_sums_equal_one_device_counting_to_the_last_count():
    """uint32 totals that wrap (a seed matrix) add up as one device's atomics would have; None
    entries and 0-d counters too."""
    rng = np.random.default_rng(2)
    parts = [[rng.integers(0, 2**32, 50, dtype=np.uint32), rng.integers(0, 2**40, 9, dtype=np.uint64),
              np.int64(rng.integers(0, 1000)), None] for _ in range(4)]  # fmt: skip
    sums = HostSums()
    threads = [threading.Thread(target=sums.add, args=(p, 10 + k)) for k, p in enumerate(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    one = np.zeros(50, np.uint32)
    for p in parts:
        one += p[0]  # wraps modulo 2**32
    np.testing.assert_array_equal(sums.sums[0], one)
    np.testing.assert_array_equal(sums.sums[1], sum(p[1] for p in parts))
    assert int(sums.sums[2]) == sum(int(p[2]) for p in parts) and sums.sums[3] is None
    assert sums.count == 46 and sums.added == 4
    assert sums.sums[0].dtype == np.uint32 and sums.sums[1].dtype == np.uint64


class _Handing:
    """A share that hands its counts in when it finishes (as the probabilistic GPU share does)."""

    def __init__(self, backend, total, sums, fail_slowly=False):
        self.backend, self.total, self.sums, self.fail_slowly = backend, total, sums, fail_slowly
        self.seen = np.zeros(total, np.int64)

    def launch(self, start, count):
        if self.fail_slowly:
            time.sleep(0.3)  # the others run dry and finish meanwhile
            raise RuntimeError("device lost (injected)")
        self.seen[start : start + count] += 1
        time.sleep(0.001)

    def finish(self):
        self.sums.add([self.seen], int(self.seen.sum()))
        self.seen = np.zeros(self.total, np.int64)
        return self


def test_finishing_early_then_tracking_a_failed_devices_ranges_counts_each_item_once():
    total, sums, finishes = 5000, HostSums(), []
    backends = simulated_backends(3)

    def open_share(backend, report):
        return _Handing(backend, total, sums, fail_slowly=backend.device_id == 0)

    run = run_shared(backends, total, open_share, largest=200, smallest=20, finish_early=True)
    finishes = [r.timeline_s for r in run.reports]
    assert sums.sums[0].tolist() == [1] * total and sums.count == total
    assert [b.device_id for b in run.backends] == [1, 2]
    assert "GPU 0 (simulated on the CPU): RuntimeError: device lost (injected) while tracking" in run.notes[0]
    assert sums.added >= 4  # devices 1 and 2 handed in twice: before and after the given-back range
    assert all({"ready", "done", "finished"} <= set(t) for t in finishes[1:])
    assert run.reports[0].failed and run.reports[1].as_dict()["index"] == 1


@pytest.mark.gpu
def test_on_every_gpu_the_uploaded_parts_make_the_whole_field():
    """Every GPU (or two shares of one): its own part from the host, the others by peer copy
    (a same-device copy for two shares of one GPU), bytes equal to the host's."""
    from tractlens.gpu.backend import get_backend, gpu_backends, gpu_count

    backends = gpu_backends() if gpu_count() > 1 else [get_backend("gpu")] * 2
    host = _field(3)
    big = np.random.default_rng(4).random(40_000_000).astype(np.float32)  # 160 MB: through the staging buffers
    upload = ShardedUpload((*host, big), len(backends))
    out = [None] * len(backends)

    def one(i):
        with backends[i].activate():
            arrays = upload.allocate(backends[i])
            upload.fill(backends[i], i, arrays)
            out[i] = [backends[i].to_host(a) for a in arrays]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(backends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for arrays in out:
        assert arrays is not None
        for got, want in zip(arrays, (*host, big), strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_a_tracker_with_two_lanes_counts_as_one_lane():
    """KernelTracker(lanes=2): chunks on two streams at once, the same totals to the last count."""
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.probabilistic_kernel import KernelTracker

    from .test_multidevice import _split_case

    field_, bits, seeds, params = _split_case()
    gpu = get_backend("gpu")
    total = len(seeds) * params.n_samples
    results = []
    for lanes in (1, 2):
        tracker = KernelTracker(gpu, field_, bits, seeds, params, 1, 1, max_batch=97, seed_matrix=True, lanes=lanes)
        for start in range(0, total, 97):
            tracker.launch(start, min(97, total - start))
        results.append(tracker.result())
    a, b = results
    np.testing.assert_array_equal(a.paths, b.paths)
    np.testing.assert_array_equal(a.seed_targets, b.seed_targets)
    np.testing.assert_array_equal(a.seed_matrix, b.seed_matrix)
    assert (a.waytotal, a.streamlines, a.steps) == (b.waytotal, b.streamlines, b.steps) and a.waytotal > 0
    assert b.provenance["lanes"] == 2
