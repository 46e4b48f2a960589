"""GPU out of memory: smaller batches first, then the CPU, with a note (app.pipelines._fallback).

In CI (no GPU) the GPU is a stand-in backend whose engine runs the real CPU code for a few
batches and then raises :class:`OutOfDeviceMemory`, as an engine does when even one item no
longer fits; the pipelines must finish on the CPU with exactly the CPU's result, deliver no
streamline twice, and say what happened. The ``gpu``-marked tests do it for real on a CUDA
device with CuPy's memory pool capped.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tractlens.app import masking
from tractlens.app.pipelines import _fallback
from tractlens.gpu import deterministic, engines, filters, geodesic, geodesic_field, geodesic_params
from tractlens.gpu.backend import Backend, OutOfDeviceMemory, get_backend


class _Pool:
    def free_all_blocks(self) -> None:
        pass


FAKE_GPU = Backend("gpu", SimpleNamespace(get_default_memory_pool=_Pool), "Stand-in GPU")


@pytest.fixture
def fake_gpu(monkeypatch):
    """``auto`` and ``gpu`` resolve to the stand-in GPU inside the fallback helpers."""
    real = get_backend

    def resolve(device="auto"):
        if device is FAKE_GPU or (isinstance(device, str) and device in ("auto", "gpu")):
            return FAKE_GPU
        return real(device)

    monkeypatch.setattr(_fallback, "get_backend", resolve)

    def median(image, passes, backend):  # the brain mask's filter, computed on the host
        assert backend is FAKE_GPU
        for _ in range(passes):
            image = masking.median3(image)
        return image

    monkeypatch.setattr(filters, "median3_passes", median)
    # ``auto``'s device choice sees a ready GPU and no cost model: the GPU, as before the rule.
    monkeypatch.setattr(engines, "gpu_state", lambda: engines.GpuState(imported=True, warmed=True))
    monkeypatch.setattr(engines, "DEFAULT_COSTS", engines.CostModel(methods={}))
    return FAKE_GPU


def _runs_out_after(original, good_batches: int, batch_items: int):
    """An engine that, on the stand-in GPU, computes ``good_batches`` batches (on the CPU, in
    batches of ``batch_items``) and then runs out of memory; elsewhere the real engine."""

    def engine(*args, device="auto", max_batch=None, **kwargs):
        if device is not FAKE_GPU:
            yield from original(*args, device=device, max_batch=max_batch, **kwargs)
            return
        for i, batch in enumerate(original(*args, device="cpu", max_batch=batch_items, **kwargs)):
            if i == good_batches:
                raise OutOfDeviceMemory("Stand-in GPU ran out of memory even for one item (about 1.0 MiB needed)")
            yield batch

    return engine


@pytest.fixture(scope="module")
def demo_field(demo_dir):
    from tractlens.app.pipelines.track import load_tensor_field

    return load_tensor_field(dwi=demo_dir / "dwi.nii.gz", device="cpu")


def _arc_seed(demo_dir) -> np.ndarray:
    import nibabel as nib

    return np.asarray(nib.load(demo_dir / "roi_arc_seed.nii.gz").dataobj) > 0


def test_deterministic_tracking_continues_on_the_cpu_where_the_gpu_stopped(demo_field, demo_dir, fake_gpu, monkeypatch):
    from tractlens.app.pipelines.track import deterministic_pipeline

    seed = _arc_seed(demo_dir)
    options = {"seed_mask": seed, "seeds_per_voxel": 3, "params": deterministic.DeterministicParams()}
    reference = deterministic_pipeline(demo_field, device="cpu", **options)
    monkeypatch.setattr(deterministic, "track", _runs_out_after(deterministic.track, 2, 40))
    delivered = []
    result = deterministic_pipeline(demo_field, device="auto", on_batch=delivered.append, **options)
    ours, ref = result.tractogram, reference.tractogram
    assert len(ref) > 100  # more seeds than the two stand-in GPU batches covered
    np.testing.assert_array_equal(ours.offsets, ref.offsets)
    np.testing.assert_array_equal(ours.points, ref.points)
    assert sum(len(t) for t in delivered) == len(ref)  # each streamline delivered once
    assert any("ran out of memory" in note and "CPU instead after 80 items" in note for note in result.notes)
    assert result.provenance["backend"] == "gpu then cpu"


def test_geodesic_tracking_continues_on_the_cpu_where_the_gpu_stopped(demo_field, demo_dir, fake_gpu, monkeypatch):
    from tractlens.app.pipelines.track import geodesic_pipeline

    options = {
        "seed_mask": _arc_seed(demo_dir),
        "directions": 12,
        "params": geodesic_params.GeodesicParams(max_steps=200),
    }
    reference = geodesic_pipeline(demo_field, device="cpu", **options)
    monkeypatch.setattr(geodesic_field, "prepare_metric", _prepare_then_fail(geodesic_field.prepare_metric))
    monkeypatch.setattr(geodesic, "track", _runs_out_after(geodesic.track, 1, 100))
    result = geodesic_pipeline(demo_field, device="auto", **options)
    np.testing.assert_array_equal(
        result.tractogram.streamline_scalars["cm"], reference.tractogram.streamline_scalars["cm"]
    )
    np.testing.assert_array_equal(result.tractogram.points, reference.tractogram.points)
    notes = [n for n in result.notes if "ran out of memory" in n]
    assert len(notes) == 2 and "geodesic metric" in notes[0] and "after 100 items" in notes[1]


def _prepare_then_fail(original):
    """The metric's preparation runs out of memory on the stand-in GPU (done again on the CPU)."""

    def prepare(*args, device="auto", **kwargs):
        if device is FAKE_GPU:
            raise OutOfDeviceMemory("Stand-in GPU ran out of memory preparing the metric")
        return original(*args, device=device, **kwargs)

    return prepare


def test_tensor_fit_is_done_again_on_the_cpu(demo_dir, fake_gpu, monkeypatch):
    import tractlens.app.pipelines.dti as dti_pipeline
    from tractlens.app.io import load_dwi

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    reference = dti_pipeline.fit_dti_pipeline(dwi, device="cpu")
    original = dti_pipeline.fit_dti
    calls = []

    def fit(*args, device="auto", **kwargs):
        calls.append(device)
        if device is FAKE_GPU:
            raise OutOfDeviceMemory("Stand-in GPU ran out of memory even for one item")
        return original(*args, device=device, **kwargs)

    monkeypatch.setattr(dti_pipeline, "fit_dti", fit)
    result = dti_pipeline.fit_dti_pipeline(dwi, device="auto")
    assert calls[0] is FAKE_GPU and calls[1].name == "cpu"
    np.testing.assert_array_equal(result.map("fa"), reference.map("fa"))
    assert any("computed on the CPU instead" in w for w in result.warnings)


def test_probabilistic_run_starts_again_on_the_cpu(demo_bedpostx, demo_dir, fake_gpu, monkeypatch):
    import tractlens.app.pipelines.probabilistic as prob_pipeline

    run = prob_pipeline.prepare_probabilistic(
        demo_bedpostx, seed=demo_dir / "roi_arc_seed.nii.gz", params=prob_pipeline.ProbParams(n_samples=20)
    )
    reference = run.track(device="cpu")
    original = prob_pipeline.iter_track

    def failing(*args, device="auto", **kwargs):
        if device is FAKE_GPU:
            for i, totals in enumerate(original(*args, device="cpu", **{**kwargs, "batch_streamlines": 50})):
                if i == 1:
                    raise OutOfDeviceMemory("Stand-in GPU ran out of memory even for one streamline")
                yield totals
            return
        yield from original(*args, device=device, **kwargs)

    monkeypatch.setattr(prob_pipeline, "iter_track", failing)
    totals = list(run.run(device="auto"))
    final = totals[-1]
    np.testing.assert_array_equal(final.paths, reference.paths)  # the CPU run from the start
    assert final.waytotal == reference.waytotal
    assert any("probabilistic tracking" in n and "ran out of memory" in n for n in run.notes)


def test_a_forced_gpu_reports_out_of_memory_instead_of_falling_back(demo_dir, fake_gpu, monkeypatch):
    import tractlens.app.pipelines.dti as dti_pipeline
    from tractlens.app.io import load_dwi
    from tractlens.app.jobs import describe_error

    def fit(*args, device="auto", **kwargs):
        raise OutOfDeviceMemory("Stand-in GPU ran out of memory even for one item")

    monkeypatch.setattr(dti_pipeline, "fit_dti", fit)
    with pytest.raises(OutOfDeviceMemory) as caught:
        dti_pipeline.fit_dti_pipeline(load_dwi(demo_dir / "dwi.nii.gz"), device="gpu")
    message, details = describe_error(caught.value)
    assert "Try the CPU" in message and details == ""
    # A real CPU running out of memory is not retried on the CPU either.
    with pytest.raises(OutOfDeviceMemory):
        _fallback.run_with_cpu_fallback(lambda b: fit(device=b), "cpu", [], "a fit")


# ----------------------------------------------------------------- on the GPU
@pytest.mark.gpu
def test_gpu_tensor_fit_with_a_capped_pool_uses_smaller_batches_then_the_cpu(demo_dir):
    """CuPy's pool capped: at a few MiB the fit runs in more, smaller batches with the same
    result; at 1 KiB nothing fits and the pipeline finishes on the CPU with a note."""
    import cupy as cp

    from tractlens.app.io import load_dwi
    from tractlens.app.pipelines.dti import fit_dti_pipeline

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    free = fit_dti_pipeline(dwi, device="gpu")
    cpu = fit_dti_pipeline(dwi, device="cpu")
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    try:
        pool.set_limit(size=4 * 2**20)
        capped = fit_dti_pipeline(dwi, device="auto")
        pool.free_all_blocks()
        pool.set_limit(size=1024)
        fallback = fit_dti_pipeline(dwi, device="auto")
        with pytest.raises(OutOfDeviceMemory):
            fit_dti_pipeline(dwi, device="gpu")
    finally:
        pool.set_limit(size=0)
    assert capped.fit.provenance["batches"] > free.fit.provenance["batches"]
    np.testing.assert_allclose(capped.map("fa"), free.map("fa"), atol=1e-6)
    assert not any("CPU instead" in w for w in capped.warnings)
    np.testing.assert_array_equal(fallback.map("fa"), cpu.map("fa"))
    assert any("computed on the CPU instead" in w for w in fallback.warnings)


@pytest.mark.gpu
def test_gpu_deterministic_tracking_with_a_capped_pool_finishes(demo_field, demo_dir, monkeypatch):
    import dataclasses

    import cupy as cp

    from tractlens.app.pipelines.track import deterministic_pipeline
    from tractlens.gpu import engines

    # 'auto' must pick the GPU for this small job (the measured costs give it to the CPU), so
    # that what is tested is the fall-back when the GPU runs out of memory
    costs = dict(engines.DEFAULT_COSTS.methods)
    costs["deterministic"] = dataclasses.replace(costs["deterministic"], cpu_s_per_unit=1.0)
    monkeypatch.setattr(engines, "DEFAULT_COSTS", dataclasses.replace(engines.DEFAULT_COSTS, methods=costs))

    options = {"seed_mask": _arc_seed(demo_dir), "seeds_per_voxel": 3}
    free = deterministic_pipeline(demo_field, device="gpu", **options)
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    try:
        pool.set_limit(size=1024)
        fallback = deterministic_pipeline(demo_field, device="auto", **options)
    finally:
        pool.set_limit(size=0)
    cpu = deterministic_pipeline(demo_field, device="cpu", **options)
    np.testing.assert_array_equal(fallback.tractogram.points, cpu.tractogram.points)
    assert fallback.provenance["backend"] == "gpu then cpu"
    assert len(free.tractogram) == len(cpu.tractogram)


def test_the_brain_masks_median_falls_back_to_the_cpu_or_reports(demo_dir, fake_gpu, monkeypatch):
    """The automatic mask's median filter goes to the GPU where the fit would; out of memory
    there, ``auto`` filters on the CPU (the same mask, a note) and ``gpu`` reports it."""
    import tractlens.app.pipelines.dti as dti_pipeline
    from tractlens.app.io import load_dwi

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    reference, _ = dti_pipeline.resolve_mask(dwi, None, "cpu")
    calls = []

    def median(image, passes, backend):
        calls.append(backend)
        raise OutOfDeviceMemory("Stand-in GPU ran out of memory for the median")

    monkeypatch.setattr(filters, "median3_passes", median)
    assert dti_pipeline.mask_device(dwi, "cpu") is None and dti_pipeline.mask_device(dwi, "auto") == "auto"
    notes: list[str] = []
    mask, source = dti_pipeline.resolve_mask(dwi, None, "auto", notes)
    assert calls == [FAKE_GPU]
    np.testing.assert_array_equal(mask, reference)
    assert source.startswith("computed from b=0")
    assert len(notes) == 1 and "the brain mask's median filter (" in notes[0] and "on the CPU instead" in notes[0]
    assert "batches" not in notes[0]  # one image, not batches
    with pytest.raises(OutOfDeviceMemory):
        dti_pipeline.resolve_mask(dwi, None, "gpu", [])
    assert calls == [FAKE_GPU, FAKE_GPU]
