"""Geodesic ray tracing (gpu.geodesic): metric pre-processing, straight lines and their CM,
curved bundles, ranking, engines."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.gpu import geodesic, geodesic_field, sym3
from tractlens.gpu.geodesic import track_all
from tractlens.gpu.geodesic_field import prepare_metric
from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams

SHAPE = (30, 30, 30)


def constant(matrix) -> np.ndarray:
    return np.broadcast_to(sym3.from_matrix(np, np.asarray(matrix, float)), (*SHAPE, 6)).copy()


def centre_fibres(n=60):
    return np.full((n, 3), 15.0), geodesic.fibonacci_directions(n)


def test_isotropic_field_gives_straight_lines_with_cm_one(device):
    fld = prepare_metric(constant(7e-4 * np.eye(3)), (2.0, 2.0, 2.0), device=device)
    assert fld.gain == pytest.approx(1 / 7e-4)
    starts, dirs = centre_fibres()
    out = track_all(fld, starts, dirs, GeodesicParams(max_steps=150), device=device)
    assert len(out) == len(dirs)
    np.testing.assert_allclose(out.cm, 1.0, atol=1e-5)
    for i in range(len(out)):
        line = out[i]
        chord = line[-1] - line[0]
        np.testing.assert_allclose(chord / np.linalg.norm(chord), dirs[out.fiber[i]], atol=1e-5)
        # every stored point on the chord (the kernel adds positions of ~60 mm in float32)
        offsets = line - line[0]
        perpendicular = offsets - np.outer(offsets @ dirs[out.fiber[i]], dirs[out.fiber[i]])
        assert np.abs(perpendicular).max() < (1e-4 if device == "cpu" else 1e-3)


@pytest.mark.parametrize("integrator", ["euler", "rk2", "rk4"])
def test_constant_anisotropic_field_gives_straight_lines_with_closed_form_cm(device, integrator):
    rotation = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))[0]
    tensor = rotation @ np.diag([1.7e-3, 3e-4, 3e-4]) @ rotation.T
    fld = prepare_metric(constant(tensor), (2.0, 2.0, 2.0), device=device)
    starts, dirs = centre_fibres()
    out = track_all(fld, starts, dirs, GeodesicParams(max_steps=150, integrator=integrator), device=device)
    metric = np.linalg.inv(tensor * fld.gain)
    expected = 1.0 / np.sqrt(np.einsum("ni,ij,nj->n", dirs, metric, dirs))
    np.testing.assert_allclose(out.cm_end, expected[out.fiber], rtol=1e-4)
    per_point = np.repeat(expected[out.fiber], np.diff(out.offsets))
    np.testing.assert_allclose(out.cm, per_point, rtol=1e-4)
    chords = np.stack([out[i][-1] - out[i][0] for i in range(len(out))])
    chords /= np.linalg.norm(chords, axis=1, keepdims=True)
    np.testing.assert_allclose(chords, dirs[out.fiber], atol=1e-4)


def test_preprocessing_repairs_counts_and_sharpens():
    tensor = constant(np.diag([1.7e-3, 3e-4, 3e-4]))
    tensor[1, 1, 1] = sym3.from_matrix(np, np.diag([1e-3, 2e-4, -1e-4]))  # not positive definite
    tensor[2, 2, 2] = 0.0  # outside the fit: identity, not counted
    tensor[3, 3, 3] = np.nan
    tensor[4, 4, 4] = sym3.from_matrix(np, np.diag([8e-4, 7e-4, 7e-4]))  # low FA: sharpened
    inverse = MetricParams(metric="inverse", gain=1000.0, sharpen_power=3, sharpen_fa=0.2)  # seed 004, Algorithm 1
    fld = prepare_metric(tensor, (1.0, 1.0, 1.0), inverse)
    assert fld.repaired == 1 and fld.sharpened == 1
    np.testing.assert_allclose(fld.data[1, 1, 1, :6], [1, 0, 0, 1, 0, 1])
    np.testing.assert_allclose(fld.data[2, 2, 2, :6], [1, 0, 0, 1, 0, 1])
    np.testing.assert_allclose(fld.data[3, 3, 3, :6], [1, 0, 0, 1, 0, 1])
    np.testing.assert_allclose(fld.data[4, 4, 4, :6], [0.8**3, 0, 0, 0.7**3, 0, 0.7**3], rtol=1e-6)
    np.testing.assert_allclose(fld.data[10, 10, 10, :6], [1.7, 0, 0, 0.3, 0, 0.3], rtol=1e-6)  # FA high: as is
    assert any("non-positive-definite" in note for note in fld.notes)
    assert any("NaN" in note for note in fld.notes)


def test_metric_derivatives_central_inside_one_sided_on_borders():
    x = np.arange(SHAPE[0], dtype=float)
    tensor = np.zeros((*SHAPE, 6))
    diffusivity = 1.0 / (1.0 + 0.1 * x) ** 1  # G_xx = 1 + 0.1 x (linear): exact differences
    tensor[..., 0] = diffusivity[:, None, None]
    tensor[..., 3] = tensor[..., 5] = 1.0
    fld = prepare_metric(tensor, (2.0, 1.0, 1.0), MetricParams(metric="inverse", gain=1.0))
    # dG_xx/dx in mm, borders included; stored at float16 precision (2^-11 relative)
    np.testing.assert_allclose(fld.data[..., 6], 0.1 / 2.0, rtol=2.0**-11)
    np.testing.assert_allclose(fld.data[..., 12:24], 0.0, atol=1e-7)


def test_derivatives_keep_float16_precision_at_any_scale():
    """The scale brings the largest derivative into [2^14, 2^15) (float16's largest value is
    65504); every stored derivative is a float16 value over that scale, within 2^-11 relative
    of the exact one, whatever the field's magnitude."""
    for largest in (3e-9, 0.05, 1.0, 7e4, 1e9):
        scale = geodesic_field.derivative_scale(largest)
        assert 2.0**14 <= largest * scale < 2.0**15 and np.log2(scale) == round(np.log2(scale))
    assert geodesic_field.derivative_scale(0.0) == 1.0
    x = np.arange(SHAPE[0], dtype=float)
    for slope in (1e-6, 0.1, 300.0):
        tensor = np.zeros((*SHAPE, 6))
        tensor[..., 0] = (1.0 / (1.0 + slope * x))[:, None, None]  # G_xx = 1 + slope x
        tensor[..., 3] = tensor[..., 5] = 1.0
        fld = prepare_metric(tensor, (1.0, 1.0, 1.0), MetricParams(metric="inverse", gain=1.0))
        scaled = fld.data[..., 6:].astype(np.float64) * fld.derivative_scale
        np.testing.assert_array_equal(scaled, scaled.astype(np.float16).astype(np.float64))
        assert 2.0**14 <= np.abs(scaled).max() < 2.0**15
        np.testing.assert_allclose(fld.data[..., 6], slope, rtol=2.0**-11)


def arc_field():
    """Fibres on circles around (15, 15) in the xy-plane, radius 6..12 voxels; isotropic elsewhere."""
    x, y = np.meshgrid(np.arange(SHAPE[0]) - 15.0, np.arange(SHAPE[1]) - 15.0, indexing="ij")
    t = np.stack([-y, x, np.zeros_like(x)], -1)
    t /= np.linalg.norm(t, axis=-1, keepdims=True) + 1e-12
    matrix = 3e-4 * np.eye(3) + 1.4e-3 * t[..., :, None] * t[..., None, :]
    r = np.hypot(x, y)
    matrix[(r < 6) | (r > 12)] = 7e-4 * np.eye(3)
    return np.broadcast_to(sym3.from_matrix(np, matrix)[:, :, None], (*SHAPE, 6)).copy()


def test_fibres_along_the_arc_reach_the_target_and_rank_highest(device):
    from tractlens.app.pipelines.track import TensorField, geodesic_pipeline

    field = TensorField.from_tensor(arc_field(), np.diag([2.0, 2.0, 2.0, 1.0]))
    seed = np.zeros(SHAPE, bool)
    seed[23:26, 14:17, 14:17] = True  # on the circle of radius 9, at angle 0
    target = np.zeros(SHAPE, bool)
    target[4:7, 14:17, 10:20] = True  # the opposite side, angle 180°
    result = geodesic_pipeline(
        field, seed_mask=seed, target=target, directions=200, params=GeodesicParams(step=0.2, max_steps=800),
        top_percent=10, device=device,
    )  # fmt: skip
    tract = result.tractogram
    assert result.provenance["reached_target"] > 20
    assert len(tract) >= 2
    cm = tract.streamline_scalars["cm"]
    assert np.all(np.diff(cm) <= 0)  # ranked, best first
    # The best fibres follow the arc: they stay between radius 6 and 12.
    best = tract[0]
    radius = np.hypot(best[:, 0] - 15.0, best[:, 1] - 15.0)
    assert radius.min() > 5.0 and radius.max() < 13.0, (radius.min(), radius.max())


def u_fibre_field():
    """Seed 004's U-fibre phantom (Figure 5.2) in the xy-plane: two stems along y (x 6..10 and
    20..24, y 14..36) joined by a half ring under them (centre (15, 14), radius 5..9), the
    main eigenvector along the U; everything else, the gap between the stems included,
    isotropic with the same mean diffusivity."""
    shape = (32, 40, 7)
    x, y = np.meshgrid(np.arange(shape[0]) + 0.0, np.arange(shape[1]) + 0.0, indexing="ij")
    e1 = np.zeros((*shape[:2], 3))
    stems = ((np.abs(x - 8) <= 2) | (np.abs(x - 22) <= 2)) & (y >= 14) & (y <= 36)
    e1[stems] = [0.0, 1.0, 0.0]
    r = np.hypot(x - 15, y - 14)
    ring = (r >= 5) & (r <= 9) & (y < 14)
    e1[ring] = np.stack([-(y - 14), x - 15, np.zeros_like(x)], -1)[ring] / r[ring, None]
    matrix = np.broadcast_to(7.7e-4 * np.eye(3), (*shape[:2], 3, 3)).copy()
    along = stems | ring
    matrix[along] = 3e-4 * np.eye(3) + 1.4e-3 * e1[along][:, :, None] * e1[along][:, None, :]
    tensor = np.broadcast_to(sym3.from_matrix(np, matrix)[:, :, None], (*shape, 6)).copy()
    return tensor, shape


def test_u_fibre_shortcuts_across_the_isotropic_gap_are_filtered_out(device):
    """Seed 004, Figure 5.2: shooting in all directions (of the U's plane, where the phantom
    lies) from the top of one stem, many fibres cross the isotropic gap straight to the
    other stem; they have a lower CM than those that follow the U, and region-to-region
    filtering — keep what reaches the target, then the top CM — removes them."""
    tensor, shape = u_fibre_field()
    target = np.zeros(shape, bool)
    target[20:25, 28:34, :] = True  # top of the right stem
    fld = prepare_metric(tensor, (1.5, 1.5, 1.5), MetricParams(metric="inverse"), target=target, device=device)
    seeds = np.array([[x, y, 3.0] for x in (7.0, 8.0, 9.0) for y in (30.0, 31.0)])  # top of the left stem
    angle = np.arange(720) * 2 * np.pi / 720
    circle = np.stack([np.cos(angle), np.sin(angle), np.zeros_like(angle)], -1)
    starts, dirs = np.repeat(seeds, len(circle), 0), np.tile(circle, (len(seeds), 1))
    params = GeodesicParams(step=0.2, max_steps=1500)
    reached = track_all(fld, starts, dirs, params, only_reaching=True, device=device)
    lowest_y = np.array([reached[i][:, 1].min() for i in range(len(reached))])
    along_u, shortcut = lowest_y < 12, lowest_y > 20  # went round the ring / never went down
    assert along_u.sum() >= 5 and shortcut.sum() >= 50, (along_u.sum(), shortcut.sum())
    assert along_u.sum() + shortcut.sum() == len(reached)
    cm = reached.cm_target
    assert cm[along_u].min() > cm[shortcut].max(), (cm[along_u].min(), cm[shortcut].max())
    kept = geodesic.top_fraction(cm, 100.0 * along_u.sum() / len(reached))
    assert np.all(along_u[kept]) and len(kept) == along_u.sum()


def test_top_fraction_and_directions():
    cm = np.array([0.5, 2.0, 1.0, 1.5])
    np.testing.assert_array_equal(geodesic.top_fraction(cm, 50), [1, 3])
    np.testing.assert_array_equal(geodesic.top_fraction(cm, 100), [1, 3, 2, 0])
    with pytest.raises(ValueError):
        geodesic.top_fraction(cm, 0)
    d = geodesic.fibonacci_directions(500)
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0)
    assert np.abs(d.mean(axis=0)).max() < 0.01  # spread over the whole sphere
    cone = geodesic.cone_directions(np.array([[0.0, 1.0, 0.0]]), 40, 20.0)[0]
    angles = np.degrees(np.arccos(np.abs(cone @ [0.0, 1.0, 0.0])))
    assert angles.max() <= 20.0 + 1e-9 and (cone[:, 1] > 0).sum() == 20


def test_stopping_rules(device):
    fld = prepare_metric(constant(7e-4 * np.eye(3)), (1.0, 1.0, 1.0), device=device)
    start, direction = np.array([[15.0, 15.0, 15.0]]), np.array([[1.0, 0.0, 0.0]])
    out = track_all(fld, start, direction, GeodesicParams(step=0.5, max_steps=7, store_every=3), device=device)
    assert out.stop[0] == geodesic.MAX_STEPS and out.steps[0] == 7
    np.testing.assert_allclose(out[0][:, 0], [15.0, 16.5, 18.0, 18.5])  # every 3rd point and the last
    out = track_all(fld, start, direction, GeodesicParams(step=0.5, max_length_mm=4.0), device=device)
    assert out.stop[0] == 1 and out[0][-1, 0] == pytest.approx(19.0)
    out = track_all(fld, start, direction, GeodesicParams(step=0.5), device=device)
    assert out.stop[0] == 2 and out[0][-1, 0] == pytest.approx(29.0)  # the next point leaves the volume
    mask = np.ones(SHAPE, bool)
    mask[20:] = False
    target = np.zeros(SHAPE, bool)
    target[18] = True
    fld = prepare_metric(constant(7e-4 * np.eye(3)), (1.0, 1.0, 1.0), mask=mask, target=target, device=device)
    out = track_all(fld, start, direction, GeodesicParams(step=0.5), device=device)
    assert out.stop[0] == geodesic.REACHED_TARGET and out[0][-1, 0] == pytest.approx(17.5)
    assert out.reached[0] == 5 and out.cm_target[0] == pytest.approx(1.0)
    out = track_all(
        fld, start, direction, GeodesicParams(step=0.5, stop_at_target=False, mask_tolerance_mm=0), device=device
    )
    assert out.stop[0] == 3 and out[0][-1, 0] < 19.5  # then the mask


@pytest.mark.parametrize("bad", [{"step": 0}, {"integrator": "rk3"}, {"max_steps": 0}, {"store_every": 0}])
def test_bad_parameters(bad):
    with pytest.raises(ValueError):
        GeodesicParams(**bad)


@pytest.mark.gpu
@pytest.mark.parametrize("integrator", ["euler", "rk2", "rk4"])
def test_kernel_matches_the_numpy_reference(integrator):
    """float32 kernel vs float64 reference on a curved field, 1000 steps: endpoints within 1e-3
    voxel, CM within 1e-4 relative, in the metric this bound was set for (D⁻¹; the conformal
    metrics' kernel is held to the reference in test_geodesic_metrics)."""
    fld = prepare_metric(arc_field(), (2.0, 2.0, 2.0), MetricParams(metric="inverse"), device="cpu")
    starts = np.tile([[24.0, 15.0, 15.0]], (64, 1))
    dirs = geodesic.fibonacci_directions(64)
    params = GeodesicParams(step=0.1, max_steps=1000, integrator=integrator, store_every=1)
    ref = track_all(fld, starts, dirs, params, device="cpu")
    gpu = track_all(fld, starts, dirs, params, device="gpu")
    np.testing.assert_array_equal(ref.fiber, gpu.fiber)
    same = np.diff(ref.offsets) == np.diff(gpu.offsets)
    assert same.mean() > 0.95, same.mean()
    worst_end = max(float(np.abs(ref[i][-1] - gpu[i][-1]).max()) for i in range(len(ref)) if same[i])
    worst_cm = float(np.max(np.abs(ref.cm_end - gpu.cm_end)[same] / ref.cm_end[same]))
    print(f"{integrator}: {same.mean():.1%} same length, endpoints {worst_end:.2e} voxel, CM {worst_cm:.2e} rel")
    assert worst_end < 1e-3 and worst_cm < 1e-4


@pytest.mark.gpu
def test_kernel_matches_the_reference_on_many_fibres_from_many_cells():
    """20 000 fibres in random cells and directions (many more than resident threads, so
    threads take several fibres each and refill their cell caches): every fibre is written,
    with the reference's stop reason, step count and end point."""
    rng = np.random.default_rng(7)
    tensor = arc_field()
    tensor += sym3.from_matrix(np, 2e-4 * np.eye(3) * rng.uniform(0, 1, (*SHAPE, 1, 1)))
    mask = np.ones(SHAPE, bool)
    mask[:, :, :3] = False
    fld = prepare_metric(tensor, (2.0, 1.5, 1.0), mask=mask, device="cpu")
    n = 20_000
    starts = rng.uniform(-0.4, 29.4, (n, 3))
    dirs = rng.normal(size=(n, 3))
    params = GeodesicParams(step=0.25, max_steps=120, store_every=7, max_angle_deg=60)
    ref = track_all(fld, starts, dirs, params, device="cpu")
    gpu = track_all(fld, starts, dirs, params, device="gpu")
    np.testing.assert_array_equal(ref.fiber, gpu.fiber)
    same = (ref.stop == gpu.stop) & (ref.steps == gpu.steps)
    assert same.mean() > 0.99, same.mean()
    ends = np.array([np.abs(ref[i][-1] - gpu[i][-1]).max() for i in np.flatnonzero(same)])
    assert np.quantile(ends, 0.99) < 1e-3, np.quantile(ends, 0.99)
    np.testing.assert_allclose(gpu.cm_end[same], ref.cm_end[same], rtol=1e-3)
