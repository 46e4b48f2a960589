"""Voxel batches side by side on the CPU's threads (gpu.backend.run_batched with threads): every
batch once, progress in order, cancellation between batches; CSD and the model fits give the
same numbers on several threads as on one."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tractlens.gpu.backend import Cancelled, get_backend, run_batched


def test_threaded_batches_cover_every_item_once_in_order():
    """The first batch waits until another batch has started on another thread (the runner
    submits several before it takes the first result), so the batches run side by side whatever
    the machine's load: a busy machine once let one thread take them all."""
    seen, progress, names = [], [], set()
    lock, side_by_side = threading.Lock(), threading.Event()

    def process(start, stop):
        with lock:
            seen.append((start, stop))
            names.add(threading.current_thread().name)
            if len(names) > 1:
                side_by_side.set()
        if start == 0:
            side_by_side.wait(timeout=120)  # never set if every batch ran on this one thread

    run_batched(get_backend("cpu"), 1000, 8, process, maximum=64, threads=3, progress=lambda d, n: progress.append(d))
    assert sorted(seen) == [(s, min(1000, s + 64)) for s in range(0, 1000, 64)]
    assert progress == [min(1000, s + 64) for s in range(0, 1000, 64)]  # in batch order
    assert len(names) > 1 and threading.current_thread().name not in names


def test_threaded_batches_stop_when_cancelled():
    done = []

    def process(start, stop):
        done.append(start)

    with pytest.raises(Cancelled):
        run_batched(get_backend("cpu"), 1000, 8, process, maximum=10, threads=2, cancelled=lambda: len(done) >= 5)
    assert 5 <= len(done) < 100  # at most the batches already submitted ran


def test_threaded_batches_raise_a_batch_error():
    def process(start, stop):
        if start == 30:
            raise ValueError("batch 30")

    with pytest.raises(ValueError, match="batch 30"):
        run_batched(get_backend("cpu"), 100, 8, process, maximum=10, threads=4)


@pytest.mark.parametrize("msmt", [False, True])
def test_csd_on_threads_equals_one_thread(monkeypatch, msmt):
    """Same batches (batch_voxels), several threads or one: the same fODFs, tissues, peaks and
    flags (BLAS on one thread in each: within 1e-12 of the serial run's, which may use several)."""
    from tests.benchmarks.bench_csd import phantom, responses
    from tests.csd_synth import gradient_table
    from tractlens.gpu.csd import CSDParams, build_model, fit_csd

    bvals, bvecs = gradient_table((1000.0, 2000.0, 3000.0), 30, 6)
    signal = phantom(300, bvals, bvecs)
    params = CSDParams(msmt=msmt)
    model = build_model(bvals, bvecs, responses(bvals, bvecs), params)
    monkeypatch.setenv("TRACTLENS_THREADS", "1")
    one = fit_csd(signal, model, params, device="cpu", batch_voxels=50)
    monkeypatch.setenv("TRACTLENS_THREADS", "3")
    many = fit_csd(signal, model, params, device="cpu", batch_voxels=50)
    for name in ("sh", "tissues", "peak_values"):
        np.testing.assert_allclose(getattr(many, name), getattr(one, name), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(many.flags, one.flags)
    assert many.provenance["batches"] == one.provenance["batches"] == 6


def test_model_fit_on_threads_equals_one_thread(monkeypatch):
    from tests.benchmarks.bench_models import acquisition, signals, truth
    from tractlens.gpu.models import fit_model, noddi_watson

    model = noddi_watson()
    bvals, bvecs = acquisition()
    signal = signals(model, truth("noddi-watson", 120, seed=3), bvals, bvecs, seed=3)
    monkeypatch.setenv("TRACTLENS_THREADS", "1")
    one = fit_model(model, signal, bvals, bvecs, device="cpu", batch_voxels=40)
    monkeypatch.setenv("TRACTLENS_THREADS", "3")
    many = fit_model(model, signal, bvals, bvecs, device="cpu", batch_voxels=40)
    assert many.values.keys() == one.values.keys()
    for name in one.values:
        np.testing.assert_allclose(many.values[name], one.values[name], rtol=1e-9, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(many.directions, one.directions, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(many.flags, one.flags)


def test_selection_on_threads_equals_one_thread(monkeypatch):
    from tests.benchmarks.bench_render import synthetic_tractogram
    from tractlens.gpu.select import select_streamlines

    tract = synthetic_tractogram(3000)
    lo = np.floor(tract.points.min(axis=0)).astype(int)
    points = tract.points - lo.astype(np.float32)
    size = int(np.ceil(points.max())) + 2
    roi = np.zeros((size,) * 3, dtype=bool)
    centre = size // 2
    roi[centre - 6 : centre + 6, centre - 6 : centre + 6, centre - 6 : centre + 6] = True
    monkeypatch.setenv("TRACTLENS_THREADS", "1")
    one = select_streamlines(points, tract.offsets, [roi], device="cpu")
    monkeypatch.setenv("TRACTLENS_THREADS", "3")
    many = select_streamlines(points, tract.offsets, [roi], device="cpu")
    assert 0 < int(one.selected.sum()) < 3000
    np.testing.assert_array_equal(many.selected, one.selected)
