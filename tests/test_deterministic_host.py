"""Deterministic tracking's compiled CPU engine (gpu.deterministic_host) against the NumPy
reference (the arrays engine), and its fallback without numba."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_deterministic import demo_tensor_field
from tractlens.gpu import deterministic_host, host
from tractlens.gpu.deterministic import DeterministicParams, track_all
from tractlens.gpu.seeding import seeds_in_mask


def _compare(ref, other, tolerance):
    """Same seeds kept; the same number of points for nearly all; points within ``tolerance``
    voxel (a stopping decision may flip where a value sits on its threshold to rounding: such
    streamlines must be rare and agree on their common part)."""
    np.testing.assert_array_equal(ref.seed_index, other.seed_index)
    same_length = ref.counts == other.counts
    assert same_length.mean() > 0.995, same_length.mean()
    worst = 0.0
    for i in range(len(ref)):
        a, b = ref[i], other[i]
        if same_length[i]:
            worst = max(worst, float(np.abs(a - b).max()))
        else:
            sa, sb = ref.seed_point[i], other.seed_point[i]
            back, fwd = min(sa, sb), min(len(a) - sa, len(b) - sb)
            worst = max(worst, float(np.abs(a[sa - back : sa + fwd] - b[sb - back : sb + fwd]).max()))
    assert worst < tolerance, worst
    return same_length.mean(), worst


@pytest.mark.parametrize(
    "options",
    [{}, {"integrator": "rk4"}, {"method": "tensorline"}, {"integrator": "rk4", "method": "tensorline"}],
    ids=["euler", "rk4", "tensorline", "tensorline-rk4"],
)
def test_compiled_engine_reproduces_the_numpy_reference(demo_dir, options):
    """Both in float64 from the same float32 field: the same streamlines within 1e-6 voxel
    (the points are float32), on several threads, in batches that split the seeds."""
    pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")
    field = demo_tensor_field(demo_dir)
    seeds = seeds_in_mask(field.mask & (field.fa > 0.15), 1, rng_seed=11)[::3]
    params = DeterministicParams(min_length_mm=0, **options)
    kwargs = {"voxel_size": field.voxel_size, "mask": field.mask, "device": "cpu"}
    ref = track_all(field.tensor, seeds, params, engine="arrays", **kwargs)
    compiled = track_all(field.tensor, seeds, params, engine="compiled", max_batch=997, **kwargs)
    assert len(ref) > 100
    _compare(ref, compiled, 1e-6)
    assert ref.reason_counts() == compiled.reason_counts()


def test_auto_picks_the_compiled_engine_on_the_cpu_and_falls_back_without_numba(monkeypatch):
    """With numba, ``engine="auto"`` on the CPU is the compiled loop; without it, the arrays
    engine (the same streamlines, slower), and asking for "compiled" names the extra."""
    pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")
    from tests.test_deterministic import straight_field

    field = straight_field()
    seeds = np.array([[5.0, 10.0, 5.0], [20.0, 9.5, 4.0]])
    with_numba = track_all(field, seeds, device="cpu")
    calls = []
    real = deterministic_host.track_compiled
    monkeypatch.setattr(deterministic_host, "track_compiled", lambda *a, **k: calls.append(1) or real(*a, **k))
    track_all(field, seeds, device="cpu")
    assert calls
    monkeypatch.setenv("TRACTLENS_DISABLE_NUMBA", "1")
    host.numba_module.cache_clear()
    try:
        calls.clear()
        without = track_all(field, seeds, device="cpu")
        assert not calls
        np.testing.assert_allclose(without.points, with_numba.points, atol=1e-6)
        with pytest.raises(ValueError, match=r"tractlens\[cpu\]"):
            track_all(field, seeds, device="cpu", engine="compiled")
    finally:
        monkeypatch.delenv("TRACTLENS_DISABLE_NUMBA")
        host.numba_module.cache_clear()
