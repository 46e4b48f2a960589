"""Work split across GPUs (gpu.multidevice): ranges, threads, failures."""

from __future__ import annotations

import threading

import numpy as np
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


def _split_case():
    from tractlens.gpu.probabilistic_params import ProbParams, mask_bits

    from .test_probabilistic import slab, straight_bundle

    field_, brain, bundle = straight_bundle(noise=0.3)
    bits = mask_bits(brain, targets=[slab(26, 28)], waypoints=[slab(20, 21)])
    seeds = np.argwhere(bundle & slab(3, 5))
    return field_, bits, seeds, ProbParams(n_samples=37, n_steps=300)


def _assert_same(a, b):
    np.testing.assert_array_equal(a.paths, b.paths)
    np.testing.assert_array_equal(a.seed_targets, b.seed_targets)
    np.testing.assert_array_equal(a.seed_matrix, b.seed_matrix)
    assert (a.waytotal, a.streamlines, a.steps) == (b.waytotal, b.streamlines, b.steps)


def test_probabilistic_tracking_split_over_three_shares_equals_one_run():
    """Three shares on the CPU (the code path of three GPUs): the same totals to the last count,
    with ranges that do not fall on batch or seed boundaries."""
    from tractlens.gpu.probabilistic_numpy import track_numpy
    from tractlens.gpu.probabilistic_split import track_split

    field_, bits, seeds, params = _split_case()
    whole = track_numpy(field_, bits, seeds, params, 1, 1, seed_matrix=True)
    seen = []
    cpu = get_backend("cpu")
    split = track_split(field_, bits, seeds, params, [cpu, cpu, cpu], n_targets=1, n_waypoints=1,
                        seed_matrix=True, batch_streamlines=50, progress=lambda d, t: seen.append((d, t)))  # fmt: skip
    _assert_same(split, whole)
    assert whole.waytotal > 0 and whole.seed_targets.sum() > 0
    devices = split.provenance["devices"]
    assert sum(d["items"] for d in devices) == len(seeds) * 37 and len(devices) == 3
    assert seen[-1] == (len(seeds) * 37,) * 2 and len(seen) > 3


def test_a_cancelled_split_run_raises_cancelled():
    from tractlens.gpu.backend import Cancelled
    from tractlens.gpu.probabilistic_split import track_split

    field_, bits, seeds, params = _split_case()
    cpu = get_backend("cpu")
    calls = []
    with pytest.raises(Cancelled):
        track_split(field_, bits, seeds, params, [cpu, cpu], n_targets=1, n_waypoints=1, batch_streamlines=20,
                    cancelled=lambda: calls.append(1) or len(calls) > 3)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("shares", ["two on one GPU", "every GPU"])
def test_probabilistic_kernel_split_equals_one_gpu_run(shares, lanes):
    from tractlens.gpu.probabilistic_kernel import track_kernel
    from tractlens.gpu.probabilistic_split import track_split

    field_, bits, seeds, params = _split_case()
    gpu = get_backend("gpu")
    whole = track_kernel(gpu, field_, bits, seeds, params, 1, 1, seed_matrix=True)
    backends = [gpu, gpu] if shares == "two on one GPU" else gpu_backends()
    split = track_split(field_, bits, seeds, params, backends, n_targets=1, n_waypoints=1, seed_matrix=True,
                        batch_streamlines=64, smallest_chunk=16, lanes=lanes)  # fmt: skip
    _assert_same(split, whole)
    devices = split.provenance["devices"]
    assert sum(d["chunks"] for d in devices) > 2 * len(devices)  # several chunks each: the lanes took turns
    assert all({"upload", "gather", "setup", "compute", "copy_back"} <= set(d["stages_s"]) for d in devices)
    for d in devices:  # every chunk timed on the device
        assert sum(n for n, _ in d["chunk_s"]) == d["items"] and all(s > 0 for _, s in d["chunk_s"])


def test_a_probabilistic_run_shared_out_gives_the_counts_of_one_run(demo_bedpostx, demo_dir):
    """The pipeline's --gpus path (ProbabilisticRun.track_on_gpus), its shares on the CPU here:
    the totals and the summary's device line as for real GPUs."""
    from tractlens.app.pipelines.probabilistic import prepare_probabilistic
    from tractlens.gpu.probabilistic_params import ProbParams

    run = prepare_probabilistic(demo_bedpostx, demo_dir / "roi_arc_seed.nii.gz", params=ProbParams(n_samples=30))
    one = run.track(device="cpu")
    cpu = get_backend("cpu")
    shared = run.track_on_gpus(2, backends=[cpu, cpu])
    np.testing.assert_array_equal(shared.paths, one.paths)
    assert (shared.waytotal, shared.streamlines, shared.steps) == (one.waytotal, one.streamlines, one.steps)
    assert shared.provenance["gpus"] == 2 and shared.provenance["device"].startswith("2 × ")


def test_starting_devices_for_one_gpu_or_without_one_does_nothing():
    """``--gpus 1`` starts no thread; without a usable GPU (CI) the thread ends quietly and the
    run reports the missing device itself."""
    from tractlens.gpu.multidevice import start_devices

    assert start_devices(1) is None
    if gpu_count() == 0:
        thread = start_devices(4)
        thread.join(timeout=60)
        assert not thread.is_alive()


@pytest.mark.gpu
def test_started_devices_have_contexts_staging_and_peer_access():
    """What a shared run would otherwise pay inside its tracking time: each GPU's staging buffers
    and, where the hardware allows, its direct access to every other GPU's memory."""
    import cupy

    from tractlens.gpu import multidevice_copy, transfer
    from tractlens.gpu.multidevice import start_devices

    n = gpu_count()
    thread = start_devices(max(n, 2))
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert set(range(n)) <= set(transfer._stages)
    for i in range(n):
        for j in range(n):
            if i != j and cupy.cuda.runtime.deviceCanAccessPeer(i, j):
                assert (i, j) in multidevice_copy._peers  # enabled by the start, not by a run
