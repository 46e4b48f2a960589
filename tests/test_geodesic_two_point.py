"""Two-point geodesic ray tracing (gpu.geodesic_shooting, app.pipelines.track_two_point)."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.gpu import geodesic
from tractlens.gpu.geodesic_field import prepare_metric
from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams
from tractlens.gpu.geodesic_shooting import best_sampled_directions, shoot

from .test_geodesic import arc_field, constant


def _coarse_directions(points: int, n: int = 6) -> np.ndarray:
    """A few directions per seed point (the axes, both ways): no ray passes near a target."""
    axes = np.array([[1.0, 0, 0], [-1.0, 0, 0], [0, 1.0, 0], [0, -1.0, 0], [0, 0, 1.0], [0, 0, -1.0]])[:n]
    return np.broadcast_to(axes, (points, n, 3)).copy()


def test_shooting_joins_every_pair_in_a_constant_field_with_the_closed_form_cm(device):
    """Geodesics of a constant metric are straight: shooting from six axis directions must turn
    each ray onto the chord to its target point (miss ≤ tolerance) and the CM there is
    1 / sqrt(dᵀ G d) for the chord's direction d."""
    rotation = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))[0]
    tensor = rotation @ np.diag([1.7e-3, 4e-4, 3e-4]) @ rotation.T
    fld = prepare_metric(constant(tensor), (2.0, 2.0, 2.0), MetricParams(metric="inverse"), device=device)
    seeds = np.array([[10.0, 12.0, 14.0], [11.0, 15.0, 13.0]])
    targets = np.array([[20.0, 18.0, 16.0], [19.0, 9.0, 21.0], [6.0, 22.0, 17.0]])
    result = shoot(fld, seeds, targets, _coarse_directions(2), GeodesicParams(step=0.2), device=device)
    assert len(result) == 6 and result.hit.all(), result.miss_mm
    assert result.miss_mm.max() <= 1.0  # half the voxel size
    chord = (targets[result.target] - seeds[result.seed]) * 2.0
    d = chord / np.linalg.norm(chord, axis=1, keepdims=True)
    np.testing.assert_allclose(result.direction, d, atol=0.06)  # within 1 mm at 20–30 mm
    metric = np.linalg.inv(tensor * fld.gain)
    shot = result.direction
    expected = 1.0 / np.sqrt(np.einsum("ni,ij,nj->n", shot, metric, shot))
    np.testing.assert_allclose(result.cm, expected, rtol=1e-4)
    for i in range(len(result)):  # the geodesic runs from the seed to next to the target
        line = result[i]
        np.testing.assert_allclose(line[0], seeds[result.seed[i]], atol=1e-6)
        assert np.linalg.norm((line[-1] - targets[result.target[i]]) * 2.0) <= 1.0 + 0.2


def test_sampled_rays_alone_miss_and_shooting_refines_them(device):
    fld = prepare_metric(constant(7e-4 * np.eye(3)), (1.0, 1.0, 1.0), device=device)
    seeds, targets = np.array([[5.0, 5.0, 5.0]]), np.array([[20.0, 11.0, 8.0]])
    params = GeodesicParams(step=0.25, store_every=1, stop_at_target=False)
    _dirs, distance = best_sampled_directions(fld, seeds, _coarse_directions(1), targets, params, device=device)
    assert distance[0, 0] > 5.0  # the best axis ray passes > 5 mm from the target
    result = shoot(fld, seeds, targets, _coarse_directions(1), GeodesicParams(step=0.25), device=device)
    assert result.hit[0] and result.miss_mm[0] < 0.5 and result.iterations[0] >= 2


def test_shooting_follows_a_curved_bundle_in_the_adaptive_metric(device):
    """Seed and target on the ring of arc_field, 90° apart, the ring as the tracking mask: the
    joined geodesic stays in the ring (and the default 4 mm of tolerance beyond it)."""
    x, y = np.meshgrid(np.arange(30) - 15.0, np.arange(30) - 15.0, indexing="ij")
    ring = np.broadcast_to(((np.hypot(x, y) >= 6) & (np.hypot(x, y) <= 12))[:, :, None], (30, 30, 30))
    fld = prepare_metric(arc_field(), (2.0, 2.0, 2.0), MetricParams(metric="adaptive"), mask=ring, device=device)
    seeds, targets = np.array([[24.0, 15.0, 15.0]]), np.array([[15.0, 24.0, 15.0]])
    dirs = geodesic.cone_directions(np.array([[0.0, 1.0, 0.0]]), 40, 30.0)
    result = shoot(fld, seeds, targets, dirs, GeodesicParams(step=0.1, max_steps=1500), device=device)
    assert result.hit[0], result.miss_mm
    line = result[0]
    radius = np.hypot(line[:, 0] - 15.0, line[:, 1] - 15.0)
    assert radius.min() > 5.0 and radius.max() < 13.0, (radius.min(), radius.max())


def test_two_point_pipeline_joins_seed_points_to_target_points():
    from tractlens.app.pipelines.track import TensorField, geodesic_pipeline

    shape = (24, 9, 9)
    tensor = np.zeros((*shape, 6), np.float32)
    tensor[..., 0], tensor[..., 3], tensor[..., 5] = 1.7e-3, 0.3e-3, 0.3e-3
    field_ = TensorField.from_tensor(tensor, np.diag([2.0, 2.0, 2.0, 1.0]))
    seed = np.zeros(shape, bool)
    seed[3, 4, 3:6] = True
    target = np.zeros(shape, bool)
    target[20, 3:6, 4] = True
    result = geodesic_pipeline(field_, seed_mask=seed, target=target, two_point=True, target_points=2,
                               directions=30, cone_deg=20, device="cpu")  # fmt: skip
    prov, tract = result.provenance, result.tractogram
    assert prov["pairs"] == 3 * 2 and prov["target_points"] == 2
    assert prov["pairs_joined"] == 6 and prov["seed_points_joined"] == 3 and len(tract) == 6
    cm = tract.streamline_scalars["cm"]
    assert np.all(np.diff(cm) <= 0) and np.all(tract.streamline_scalars["miss_mm"] <= 1.0)


def test_two_point_needs_a_target():
    from tractlens.app.errors import InputError
    from tractlens.app.pipelines.track import TensorField, geodesic_pipeline

    field_ = TensorField.from_tensor(constant(7e-4 * np.eye(3)).astype(np.float32), np.eye(4))
    seed = np.zeros(field_.shape, bool)
    seed[5, 5, 5] = True
    with pytest.raises(InputError, match="needs a target"):
        geodesic_pipeline(field_, seed_mask=seed, two_point=True, directions=4, device="cpu")


def test_command_line_offers_the_metric_the_tolerance_and_two_point():
    from tractlens.app.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["track", "geodesic", "--dwi", "d", "--seed", "s", "-o", "o", "--metric", "inverse",
                              "--mask-tolerance", "2.5", "--two-point", "--target-points", "4"])  # fmt: skip
    assert getattr(args, "MetricParams.metric") == "inverse"
    assert getattr(args, "GeodesicParams.mask_tolerance_mm") == 2.5
    assert getattr(args, "GeodesicSeedingParams.two_point") is True
    assert getattr(args, "GeodesicSeedingParams.target_points") == 4
