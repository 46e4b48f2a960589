"""Work split across GPUs (gpu.multidevice): ranges, threads, failures."""

from __future__ import annotations

import threading

import pytest

from tractlens.gpu.backend import BackendError, get_backend, gpu_backends, gpu_count
from tractlens.gpu.multidevice import run_split, split_range


@pytest.mark.parametrize("total,parts,align", [(10, 3, 1), (1000, 4, 64), (3, 8, 1), (0, 2, 1), (7, 1, 4)])
def test_ranges_cover_everything_once_in_order(total, parts, align):
    ranges = split_range(total, parts, align)
    assert len(ranges) <= parts
    covered = [i for start, count in ranges for i in range(start, start + count)]
    assert covered == list(range(total))
    assert all(count > 0 for _, count in ranges)
    assert all(start % align == 0 for start, _ in ranges)
    if ranges and align == 1:
        sizes = [c for _, c in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_shares_run_at_once_and_come_back_in_order():
    cpu = get_backend("cpu")
    barrier = threading.Barrier(3, timeout=10)  # all three shares must be running together

    def work(backend, start, count, stop):
        barrier.wait()
        return (start, count, threading.current_thread().name)

    out = run_split([cpu, cpu, cpu], 9, work)
    assert [o[:2] for o in out] == [(0, 3), (3, 3), (6, 3)]
    assert len({o[2] for o in out}) == 3


def test_a_failing_share_stops_the_others_and_raises():
    cpu = get_backend("cpu")
    stopped = []

    def work(backend, start, count, stop):
        if start == 0:
            raise RuntimeError("share 0 broke")
        for _ in range(1000):
            if stop():
                stopped.append(start)
                return None
            threading.Event().wait(0.005)
        return start

    with pytest.raises(RuntimeError, match="share 0 broke"):
        run_split([cpu, cpu], 10, work)
    assert stopped == [5]


def test_asking_for_more_gpus_than_there_are_is_refused():
    with pytest.raises(BackendError, match="asked for"):
        gpu_backends(gpu_count() + 1)


@pytest.mark.gpu
def test_each_share_runs_on_its_own_device():
    backends = gpu_backends()

    def work(backend, start, count, stop):
        import cupy

        return cupy.cuda.Device().id, int(cupy.arange(start, start + count).sum())

    out = run_split(backends, 100, work)
    assert [d for d, _ in out] == [b.device_id for b in backends][: len(out)]
    assert sum(s for _, s in out) == sum(range(100))
