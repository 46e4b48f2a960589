"""Geodesic metrics (gpu.geodesic_metrics), the mask tolerance, how fibres ended, and the
directions sized for the engine."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.gpu import geodesic, sym3
from tractlens.gpu.geodesic import track_all
from tractlens.gpu.geodesic_field import prepare_metric
from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams

from .test_geodesic import SHAPE, arc_field, constant


def random_field(seed=3, shape=(8, 9, 7)):
    rng = np.random.default_rng(seed)
    rotations = np.linalg.qr(rng.normal(size=(*shape, 3, 3)))[0]
    lams = rng.uniform([1.2e-3, 3e-4, 2e-4], [1.8e-3, 6e-4, 4e-4], (*shape, 3))
    matrices = np.einsum("...ij,...j,...kj->...ik", rotations, lams, rotations)
    return sym3.from_matrix(np, matrices)


def test_adjugate_metric_is_the_determinant_times_the_inverse():
    """G = det(B)/m · B⁻¹ (B = gain · D, m the median det over the fitted voxels): the tracker is
    given its inverse, and the metric read back is the adjugate up to the constant m."""
    tensor = random_field()
    fld = prepare_metric(tensor, (1.5, 1.5, 1.5), MetricParams(metric="adjugate", gain=1000.0))
    b = sym3.to_matrix(np, tensor * 1000.0)
    det = np.linalg.det(b)
    expected = det[..., None, None] / np.median(det) * np.linalg.inv(b)
    index = np.argwhere(np.ones(tensor.shape[:3], bool)).astype(float)
    got = sym3.to_matrix(np, fld.metric(index)).reshape(expected.shape)
    scale = np.abs(expected).max()  # C is stored in float32: compare to 1e-5 of the largest entry
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)
    adjugate = np.linalg.inv(b) * det[..., None, None]  # adj(B), by its definition
    np.testing.assert_allclose(got * np.median(det), adjugate, rtol=1e-5, atol=1e-5 * scale * np.median(det))


def test_conformal_power_one_on_the_inverse_is_the_adjugate():
    tensor = random_field(5)
    adj = prepare_metric(tensor, (2.0, 2.0, 2.0), MetricParams(metric="adjugate"))
    inv_conf = prepare_metric(tensor, (2.0, 2.0, 2.0), MetricParams(metric="inverse", conformal_power=1.0))
    np.testing.assert_allclose(adj.data, inv_conf.data, rtol=1e-6)
    plain = prepare_metric(tensor, (2.0, 2.0, 2.0), MetricParams(metric="inverse"))
    assert not np.allclose(plain.data[..., :6], adj.data[..., :6], rtol=1e-3)


@pytest.mark.parametrize("bad", [{"metric": "euclid"}, {"conformal_power": -1.0}, {"conformal_power": 5.0}])
def test_bad_metric_parameters(bad):
    with pytest.raises(ValueError):
        MetricParams(**bad)


def _turns_before_leaving_the_ring(fld, radii, device):
    """Degrees that fibres started along the arc (tangent, radius r) run before leaving the ring
    of radius 6..12 of arc_field."""
    starts = np.array([[15.0 + r, 15.0, 15.0] for r in radii])
    dirs = np.tile([[0.0, 1.0, 0.0]], (len(radii), 1))
    out = track_all(fld, starts, dirs, GeodesicParams(step=0.1, max_steps=1200, store_every=1), device=device)
    angles = []
    for i in range(len(out)):
        p = out[i]
        radius = np.hypot(p[:, 0] - 15.0, p[:, 1] - 15.0)
        angle = np.degrees(np.unwrap(np.arctan2(p[:, 1] - 15.0, p[:, 0] - 15.0)))
        outside = (radius < 6) | (radius > 12)
        angles.append(angle[np.argmax(outside) - 1] if outside.any() else angle[-1])
    return np.array(angles)


def test_adaptive_metric_keeps_fibres_on_a_curved_bundle_where_the_others_run_straight(device):
    """Hao et al. 2011: the conformal factor makes the eigenvector curves geodesics. Fibres shot
    along the arc of arc_field (radius 7.5..10.5) leave the ring within 130° with D⁻¹ and its
    adjugate; with the adaptive metric every one goes round more than twice."""
    radii = (7.5, 8.5, 9.0, 9.5, 10.5)
    for metric in ("inverse", "adjugate"):
        fld = prepare_metric(arc_field(), (2.0, 2.0, 2.0), MetricParams(metric=metric), device=device)
        assert _turns_before_leaving_the_ring(fld, radii, device).max() < 130, metric
    fld = prepare_metric(arc_field(), (2.0, 2.0, 2.0), MetricParams(metric="adaptive"), device=device)
    assert _turns_before_leaving_the_ring(fld, radii, device).min() > 720
    assert any("adaptive metric" in note and "explained" in note for note in fld.notes)


def test_adaptive_factor_explains_the_curvature_of_a_noise_free_arc():
    from tractlens.gpu.geodesic_metrics import adaptive_conformal_factor

    c = prepare_metric(arc_field(), (2.0, 2.0, 2.0), MetricParams(metric="inverse")).data[..., :6].astype(float)
    weight = sym3.fractional_anisotropy_from_invariants(np, c) ** 2
    phi, info = adaptive_conformal_factor(np, c, weight, np.array([2.0, 2.0, 2.0]))
    assert info["curvature_explained"] > 0.9 and np.isfinite(phi).all()
    assert np.abs(phi).max() <= 5.0


# ------------------------------------------------------------------------------ mask tolerance
def _gap_field(device, gap=(20, 22)):
    mask = np.ones(SHAPE, bool)
    mask[gap[0] : gap[1]] = False  # a gap of two voxels (1 mm each) across the line
    return prepare_metric(constant(7e-4 * np.eye(3)), (1.0, 1.0, 1.0), mask=mask, device=device)


def test_mask_tolerance_lets_a_fibre_cross_a_short_gap_and_reports_the_excursion(device):
    fld = _gap_field(device)
    start, direction = np.array([[15.0, 15.0, 15.0]]), np.array([[1.0, 0.0, 0.0]])
    strict = track_all(fld, start, direction, GeodesicParams(step=0.5, mask_tolerance_mm=0), device=device)
    assert strict.stop[0] == geodesic.OUTSIDE_MASK and strict[0][-1, 0] == pytest.approx(19.0)
    assert strict.excursion[0] == 0
    short = track_all(fld, start, direction, GeodesicParams(step=0.5, mask_tolerance_mm=1.5), device=device)
    assert short.stop[0] == geodesic.OUTSIDE_MASK and short[0][-1, 0] == pytest.approx(20.5)
    loose = track_all(fld, start, direction, GeodesicParams(step=0.5, mask_tolerance_mm=3.0), device=device)
    assert loose.stop[0] == geodesic.OUTSIDE_VOLUME and loose[0][-1, 0] == pytest.approx(29.0)
    # nearest-voxel lookups: x = 19.5 … 21.0 (4 steps of 0.5 mm) lie in voxels 20 and 21
    assert loose.excursion[0] == pytest.approx(2.0, abs=1e-5)
    assert loose.provenance["excursions"] == 1 and loose.provenance["longest_excursion_mm"] == pytest.approx(2.0)


def test_stop_counts_cover_every_fibre_kept_or_not(device):
    fld = _gap_field(device)
    starts = np.array([[15.0, 15.0, 15.0], [15.0, 15.0, 15.0], [20.0, 15.0, 15.0], [40.0, 0.0, 0.0]])
    dirs = np.array([[1.0, 0, 0], [-1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]])
    out = track_all(fld, starts, dirs, GeodesicParams(step=0.5, mask_tolerance_mm=0), device=device)
    counts = out.provenance["stop_counts"]
    assert counts.sum() == 4  # the two that could not start are counted too
    assert counts[geodesic.OUTSIDE_MASK] == 2 and counts[geodesic.OUTSIDE_VOLUME] == 2
    assert len(out) == 2


# ------------------------------------------------------------------------------ pipeline
def test_directions_sized_for_the_engine():
    from tractlens.app.pipelines.track_geodesic import CPU_FIBRES, GPU_FIBRES, directions_for

    assert directions_for(16, on_gpu=True) == GPU_FIBRES // 16
    assert directions_for(16, on_gpu=False) == CPU_FIBRES // 16
    assert 1e5 <= 100 * directions_for(100, on_gpu=True) <= 1e6
    assert directions_for(10**6, on_gpu=False) == 16 and directions_for(1, on_gpu=True) == 20_000


def _straight_bundle():
    from tractlens.app.pipelines.track import TensorField

    shape = (24, 9, 9)
    tensor = np.zeros((*shape, 6), np.float32)
    tensor[..., 0], tensor[..., 3], tensor[..., 5] = 1.7e-3, 0.3e-3, 0.3e-3
    field_ = TensorField.from_tensor(tensor, np.diag([2.0, 2.0, 2.0, 1.0]))
    seed = np.zeros(shape, bool)
    seed[3, 3:6, 3:6] = True
    target = np.zeros(shape, bool)
    target[20, 3:6, 3:6] = True
    return field_, seed, target


def test_pipeline_sizes_directions_and_reports_how_fibres_ended():
    from tractlens.app.pipelines.track import geodesic_pipeline
    from tractlens.app.pipelines.track_geodesic import directions_for

    field_, seed, target = _straight_bundle()
    result = geodesic_pipeline(field_, seed_mask=seed, target=target, cone_deg=20, device="cpu", method="rays")
    prov = result.provenance
    assert prov["directions"] == directions_for(9, on_gpu=False) and prov["fibers"] == 9 * prov["directions"]
    assert sum(prov["stop_reasons"].values()) == prov["fibers"]
    assert prov["stop_reasons"]["reached the target"] == prov["reached_target"] > 0
    seed_points = result.tractogram.streamline_scalars["seed_point"]
    assert set(np.unique(seed_points).astype(int)) <= set(range(9)) and len(np.unique(seed_points)) == 9


def test_a_run_that_finds_nothing_says_how_fibres_ended_and_what_to_try():
    from tractlens.app.pipelines.track import geodesic_pipeline

    field_, seed, target = _straight_bundle()
    mask = np.zeros(field_.shape, bool)
    mask[2:9, 1:8, 1:8] = True  # ends long before the target, inside the volume
    params = GeodesicParams(mask_tolerance_mm=1.0)
    result = geodesic_pipeline(field_, seed_mask=seed, target=target, mask=mask, directions=10, params=params,
                               device="cpu", method="rays")  # fmt: skip
    reason = result.provenance["empty_reason"]
    assert len(result.tractogram) == 0
    assert "90 left the mask" in reason and "mask tolerance (now 1 mm)" in reason, reason


@pytest.mark.gpu
@pytest.mark.parametrize("metric", ["adjugate", "adaptive", "inverse"])
def test_kernel_matches_the_reference_with_a_mask_tolerance(metric):
    """The kernel's excursions out of the mask (tolerance 3 mm, a mask with holes) and the metrics
    made on the host: the reference's stop reasons, step counts, end points and excursions."""
    rng = np.random.default_rng(11)
    mask = rng.uniform(size=SHAPE) > 0.08  # scattered holes of one voxel
    mask[:, :, :3] = False
    fld = prepare_metric(arc_field(), (2.0, 1.5, 1.0), MetricParams(metric=metric), mask=mask, device="cpu")
    n = 20_000
    starts = rng.uniform(-0.4, 29.4, (n, 3))
    dirs = rng.normal(size=(n, 3))
    params = GeodesicParams(step=0.25, max_steps=150, store_every=7, mask_tolerance_mm=3.0)
    ref = track_all(fld, starts, dirs, params, device="cpu")
    gpu = track_all(fld, starts, dirs, params, device="gpu")
    np.testing.assert_array_equal(ref.fiber, gpu.fiber)
    assert (ref.excursion > 0).sum() > 1000  # the rule is exercised
    same = (ref.stop == gpu.stop) & (ref.steps == gpu.steps)
    assert same.mean() > 0.99, same.mean()
    ends = np.array([np.abs(ref[i][-1] - gpu[i][-1]).max() for i in np.flatnonzero(same)])
    assert np.quantile(ends, 0.99) < 1e-3, np.quantile(ends, 0.99)
    # excursions equal, but for the rare fibre whose float32 step lands on the other side of a
    # mask boundary than the float64 one: then one step apart, and at most 0.1 % of them
    gap = np.abs(gpu.excursion[same] - ref.excursion[same])
    off = gap > 1e-4 + 1e-4 * np.abs(ref.excursion[same])
    assert off.mean() <= 1e-3, off.sum()
    assert (gap[off] <= params.step + 1e-3).all(), gap[off]
    differ = np.abs(gpu.provenance["stop_counts"] - ref.provenance["stop_counts"]).sum()
    assert gpu.provenance["stop_counts"].sum() == n and differ <= 0.02 * n, differ


class _Float32Arrays:
    """NumPy with every float array made float32: the arrays engine then rounds as the kernel does."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def _narrow(dtype):
        return np.float32 if dtype in (np.float64, float) else dtype

    def asarray(self, a, dtype=None):
        out = np.asarray(a) if dtype is None else np.asarray(a, dtype=self._narrow(dtype))
        return out.astype(np.float32) if out.dtype == np.float64 else out

    def zeros(self, shape, dtype=float):
        return np.zeros(shape, self._narrow(dtype))

    def full(self, shape, value, dtype=None):
        return np.full(shape, value, None if dtype is None else self._narrow(dtype))


@pytest.mark.parametrize("metric", ["adjugate", "inverse"])
def test_a_tolerance_of_whole_steps_ends_fibres_alike_in_float32_and_float64(metric):
    """3 mm of 0.25 mm steps: the segments outside the mask sum to 3 mm up to rounding, so without
    slack float32 and float64 disagreed on 4 % of the adjugate's fibres (the kernel's mismatch
    measured on the H100); both engines allow a thousandth of a step."""
    rng = np.random.default_rng(11)
    mask = rng.uniform(size=SHAPE) > 0.08
    mask[:, :, :3] = False
    fld = prepare_metric(arc_field(), (2.0, 1.5, 1.0), MetricParams(metric=metric), mask=mask, device="cpu")
    n = 6000
    starts, dirs = rng.uniform(-0.4, 29.4, (n, 3)), rng.normal(size=(n, 3))
    params = GeodesicParams(step=0.25, max_steps=150, store_every=7, mask_tolerance_mm=3.0)
    ref = geodesic._track_arrays(np, fld, fld.data.astype(np.float64), fld.region, starts, dirs, params)
    f32 = _Float32Arrays()
    low = geodesic._track_arrays(f32, fld, fld.data, fld.region, starts.astype(np.float32), dirs.astype(np.float32),
                                 params)  # fmt: skip
    valid = ref[4]
    same = (ref[3] == low[3]) & (ref[5] == low[5])
    assert (ref[9][valid] > 0).sum() > 300  # excursions happen
    assert same[valid].mean() > 0.998, same[valid].mean()
