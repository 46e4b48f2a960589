"""The compiled CPU loops of NODDI-Watson's fit (gpu/models/watson_loops.py) and of single-shell
CSD's iteration (gpu/csd_loops.py) against their array programs, which stay the reference (and
the path without numba): the same algorithm, so the same fits to rounding."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from tractlens.gpu import host


@pytest.fixture
def arrays_engine(monkeypatch):
    """Run the array programs: numba switched off for the duration of a call."""

    def run(call):
        monkeypatch.setenv("TRACTLENS_DISABLE_NUMBA", "1")
        host.numba_module.cache_clear()
        try:
            return call()
        finally:
            monkeypatch.delenv("TRACTLENS_DISABLE_NUMBA")
            host.numba_module.cache_clear()

    return run


def test_compiled_noddi_watson_equals_the_array_program(arrays_engine):
    from tests.benchmarks.bench_models import acquisition, signals, truth
    from tractlens.gpu.models import fit_model, noddi_watson

    model = noddi_watson()
    bvals, bvecs = acquisition()
    signal = signals(model, truth("noddi-watson", 150, seed=5), bvals, bvecs, seed=5)
    signal[7] = np.nan  # a voxel left out: flagged and zero on both
    compiled = fit_model(model, signal, bvals, bvecs, device="cpu", batch_voxels=64)
    arrays = arrays_engine(lambda: fit_model(model, signal, bvals, bvecs, device="cpu", batch_voxels=64))
    assert compiled.provenance["engine"] == "compiled" and arrays.provenance["engine"] == "arrays"
    np.testing.assert_array_equal(compiled.flags, arrays.flags)
    assert compiled.flags[7] != 0 and compiled.values["v_ic"][7] == 0
    # measured: fractions within 5e-9, S0 (signal units ~100) within 3e-8
    for name in ("v_ic", "odi", "v_iso"):
        np.testing.assert_allclose(compiled.values[name], arrays.values[name], rtol=0, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(compiled.values["s0"], arrays.values["s0"], rtol=1e-8)
    np.testing.assert_allclose(compiled.directions, arrays.directions, rtol=0, atol=1e-7)
    np.testing.assert_allclose(compiled.residual, arrays.residual, rtol=1e-7)


def test_models_without_compiled_loops_run_the_array_program():
    from tractlens.gpu.models import fit_model, noddi_bingham
    from tractlens.gpu.models.host_fit import compiled_fit

    model = noddi_bingham()
    assert compiled_fit(model, None, on_cpu=True) is None
    rng = np.random.default_rng(2)
    bvals = np.r_[np.zeros(3), np.full(20, 1000.0), np.full(20, 2000.0)]
    bvecs = rng.normal(size=(43, 3))
    bvecs /= np.linalg.norm(bvecs, axis=1, keepdims=True)
    fit = fit_model(model, np.full((2, 43), 100.0), bvals, bvecs, device="cpu")
    assert fit.provenance["engine"] == "arrays"


def test_compiled_single_shell_csd_and_peaks_equal_the_array_program(arrays_engine):
    from tests.benchmarks.bench_csd import phantom, responses
    from tests.csd_synth import gradient_table
    from tractlens.gpu.csd import CSDParams, build_model, fit_csd

    bvals, bvecs = gradient_table((1000.0, 3000.0), 60, 6)
    signal = phantom(400, bvals, bvecs)
    signal[3] = np.nan
    params = CSDParams(msmt=False, lmax=8)
    model = build_model(bvals, bvecs, responses(bvals, bvecs), params)
    compiled = fit_csd(signal, model, params, device="cpu")
    arrays = arrays_engine(lambda: fit_csd(signal, model, params, device="cpu"))
    assert compiled.provenance["engine"] == "compiled" and arrays.provenance["engine"] == "arrays"
    np.testing.assert_array_equal(compiled.flags, arrays.flags)
    assert compiled.flags[3] != 0
    scale = np.linalg.norm(arrays.sh, axis=1).max()
    # measured: 1.4e-11 of the largest fODF's norm (float32 output)
    assert np.abs(compiled.sh - arrays.sh).max() <= 1e-6 * scale
    np.testing.assert_allclose(compiled.peak_values, arrays.peak_values, rtol=1e-5, atol=1e-6 * scale)
    found = arrays.peak_values > 0
    np.testing.assert_array_equal(compiled.peak_values > 0, found)
    a, b = compiled.peaks[found].astype(np.float64), arrays.peaks[found].astype(np.float64)
    angle = np.degrees(np.arctan2(np.linalg.norm(np.cross(a, b), axis=1), np.abs((a * b).sum(axis=1))))
    assert angle.max() <= 1e-3  # float32 directions: measured 3e-5°
    assert compiled.provenance["peak_engine"] == "compiled"
    assert compiled.provenance["max_iterations_used"] == arrays.provenance["max_iterations_used"]


def _python_calls(call) -> int:
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    call()
    profile.disable()
    return pstats.Stats(profile).total_calls


def test_compiled_fits_make_no_python_call_per_voxel(monkeypatch):
    """The Python calls of one batch (that hold the GIL between the compiled loops) do not grow
    with its voxels: 64 and 512 voxels in one batch cost about the same (NODDI: a few calls per
    64-voxel chunk, between which cancellation is polled)."""
    from tests.benchmarks.bench_csd import phantom, responses
    from tests.benchmarks.bench_models import acquisition, signals, truth
    from tests.csd_synth import gradient_table
    from tractlens.gpu.csd import CSDParams, build_model, fit_csd
    from tractlens.gpu.models import fit_model, noddi_watson

    monkeypatch.setenv("TRACTLENS_THREADS", "1")
    model = noddi_watson()
    bvals, bvecs = acquisition()
    signal = signals(model, truth("noddi-watson", 512, seed=3), bvals, bvecs, seed=3)
    fit_model(model, signal[:8], bvals, bvecs, device="cpu")
    few, many = (
        _python_calls(lambda n=n: fit_model(model, signal[:n], bvals, bvecs, device="cpu", batch_voxels=512))
        for n in (64, 512)
    )
    assert (many - few) / (512 - 64) < 0.2, (few, many)  # measured 0.125 a voxel: 8 calls a chunk

    g_bvals, g_bvecs = gradient_table((1000.0, 3000.0), 60, 6)
    fods = phantom(512, g_bvals, g_bvecs)
    params = CSDParams(lmax=8)
    csd = build_model(g_bvals, g_bvecs, responses(g_bvals, g_bvecs), params)
    fit_csd(fods[:8], csd, params, device="cpu")
    few, many = (
        _python_calls(lambda n=n: fit_csd(fods[:n], csd, params, device="cpu", batch_voxels=512)) for n in (64, 512)
    )
    assert many - few <= 5, (few, many)  # measured: equal
