"""Geodesic connections from the metric's distance map (gpu.geodesic_eikonal, --method eikonal)."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.gpu.backend import Cancelled
from tractlens.gpu.geodesic_eikonal import connect, half_offsets
from tractlens.gpu.geodesic_field import prepare_metric
from tractlens.gpu.geodesic_params import MetricParams

from .test_geodesic import arc_field, constant


def test_neighbourhoods_hold_every_direction_once():
    for radius, count in ((1, 13), (2, 49)):
        offsets = half_offsets(radius)
        assert len(offsets) == count
        both = {tuple(o) for o in offsets} | {tuple(-o) for o in offsets}
        assert len(both) == 2 * count  # no direction given twice, no ± pair twice


def test_a_straight_path_in_a_constant_field_has_the_closed_form_length_and_cm(device):
    """D = diag(λ1, λ2, λ2) along x, gain 1: a step of 1 mm along x costs 1/sqrt(λ1), so the
    distance to a target 10 voxels along x is 10/sqrt(λ1) and CM = sqrt(λ1)."""
    d = np.diag([2.0, 0.5, 0.5])
    fld = prepare_metric(constant(d), (1.0, 1.0, 1.0), MetricParams(metric="inverse", gain=1.0), device="cpu")
    target = np.zeros(fld.shape, bool)
    target[25, 15, 15] = True
    result = connect(fld, np.array([[15.0, 15.0, 15.0]]), target, device=device)  # edges on CuPy too
    assert result.connected.all() and len(result) == 1
    assert result.distance_mm[0] == pytest.approx(10 / np.sqrt(2.0), rel=1e-5)
    assert result.cm[0] == pytest.approx(np.sqrt(2.0), rel=1e-4)
    np.testing.assert_allclose(result[0][:, 1:], 15.0, atol=1e-6)  # straight along x


def test_the_path_follows_a_curved_bundle_where_rays_run_straight(device):
    """arc_field: fibres on a ring of radius 7.5..10.5 around (15, 15). From one end of a
    quarter of the ring to the other, the minimal geodesic (adjugate metric, the mask the ring)
    stays on the ring, though the chord between the ends is shorter."""
    tensor = arc_field()
    x, y = np.meshgrid(np.arange(tensor.shape[0]), np.arange(tensor.shape[1]), indexing="ij")
    radius = np.hypot(x - 15.0, y - 15.0)
    ring = np.broadcast_to(((radius >= 6.5) & (radius <= 11.5))[..., None], tensor.shape[:3]).copy()
    wide = np.ones_like(ring)  # no mask: the metric alone must keep the path in the ring
    fld = prepare_metric(tensor, (2.0, 2.0, 2.0), MetricParams(metric="adjugate", conformal_power=1.0),
                         mask=wide, device="cpu")  # fmt: skip
    target = np.zeros_like(ring)
    target[15, 24:26, 14:17] = True  # the ring at angle 90°
    seeds = np.array([[24.0, 15.0, 15.0], [24.5, 15.0, 15.0]])  # the ring at angle 0°
    result = connect(fld, seeds, target, device=device)
    assert result.connected.all()
    for i in range(len(result)):
        p = result[i]
        r = np.hypot(p[:, 0] - 15.0, p[:, 1] - 15.0)
        assert r.min() > 6.5 and r.max() < 11.5, (r.min(), r.max())


def test_seed_points_the_mask_does_not_join_are_not_connected():
    fld = prepare_metric(constant(np.diag([2.0, 0.5, 0.5]) * 1e-3), (1.0, 1.0, 1.0), device="cpu")
    mask = np.zeros(fld.shape, bool)
    mask[5:12, 15, 15] = True
    mask[18:26, 15, 15] = True  # a gap at 12..17
    fld = prepare_metric(constant(np.diag([2.0, 0.5, 0.5]) * 1e-3), (1.0, 1.0, 1.0), mask=mask, device="cpu")
    target = np.zeros(fld.shape, bool)
    target[25, 15, 15] = True
    result = connect(fld, np.array([[6.0, 15.0, 15.0], [19.0, 15.0, 15.0]]), target, device="cpu")
    assert result.connected.tolist() == [False, True] and len(result) == 1 and result.seed[0] == 1


def test_the_pipeline_joins_every_seed_point_by_default_and_ranks_by_cm():
    from tractlens.app.pipelines.track import geodesic_pipeline

    from .test_geodesic_metrics import _straight_bundle

    field_, seed, target = _straight_bundle()
    result = geodesic_pipeline(field_, seed_mask=seed, target=target, device="cpu")  # method auto: eikonal
    prov = result.provenance
    assert prov["method"] == "geodesic eikonal" and prov["seed_points_joined"] == prov["seed_points"] == 9
    assert prov["metric"]["metric"] == "adjugate" and prov["metric"]["conformal_power"] == 1.0
    cm = result.tractogram.streamline_scalars["cm"]
    assert len(cm) == 9 and np.all(np.diff(cm) <= 1e-6)
    rays = geodesic_pipeline(field_, seed_mask=seed, target=target, device="cpu", method="rays", directions=40)
    assert rays.provenance["method"] == "geodesic" and rays.provenance["metric"]["metric"] == "adaptive"


@pytest.mark.parametrize("bad", [{"method": "eikonal", "target": None}, {"method": "eikonal", "two_point": True},
                                 {"method": "fast"}])  # fmt: skip
def test_methods_that_cannot_run_are_refused(bad):
    from tractlens.app.errors import InputError
    from tractlens.app.pipelines.track import geodesic_pipeline

    from .test_geodesic_metrics import _straight_bundle

    field_, seed, target = _straight_bundle()
    options = {"target": target, **bad}
    with pytest.raises(InputError):
        geodesic_pipeline(field_, seed_mask=seed, device="cpu", **options)


def test_the_adaptive_metric_reports_progress_and_can_be_cancelled():
    calls = []
    prepare_metric(arc_field(), (2.0, 2.0, 2.0), device="cpu", progress=lambda d, t: calls.append((d, t)))
    assert calls and all(0 < d <= t for d, t in calls) and calls == sorted(calls)
    with pytest.raises(Cancelled):
        prepare_metric(arc_field(), (2.0, 2.0, 2.0), device="cpu", cancelled=lambda: len(calls) > 0)


def test_the_curvature_field_in_slabs_equals_the_whole_grid():
    from tractlens.gpu.geodesic_metrics import curvature_in_slabs, geodesic_curvature

    c = prepare_metric(arc_field(), (2.0, 1.5, 1.0), MetricParams(metric="inverse")).data[..., :6].astype(float)
    whole = geodesic_curvature(np, c, (2.0, 1.5, 1.0))
    slabs = curvature_in_slabs(np, c, (2.0, 1.5, 1.0), slab=4)
    for a, b in zip(whole, slabs, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_auto_takes_the_distance_map_with_a_target_and_rays_without():
    from tractlens.app.pipelines.track_geodesic import resolve_method

    assert resolve_method("auto", has_target=True, two_point=False) == "eikonal"
    assert resolve_method("auto", has_target=True, two_point=True) == "rays"
    assert resolve_method("rays", has_target=True, two_point=False) == "rays"  # asked for
    assert resolve_method("auto", has_target=False, two_point=False) == "rays"


def _noisy_field(seed: int = 3):
    """A bent bundle with noise, a mask with a hole, so that paths, graphs and extra edges are
    not trivial."""
    rng = np.random.default_rng(seed)
    tensor = arc_field() * (1.0 + 0.2 * rng.random((*arc_field().shape[:3], 1)))
    mask = np.ones(tensor.shape[:3], bool)
    mask[:, :, :4] = False
    mask[12:18, 12:18, :] = False  # the ring's inside
    return tensor, mask


def _fresh_and_reused(radius, edits):
    """connect on one field through a series of (seeds, target) edits, against connect on a
    new field (nothing kept) for each: identical results, and what was reused."""
    tensor, mask = _noisy_field()
    params = MetricParams(metric="adjugate", conformal_power=1.0)
    kept = prepare_metric(tensor, (2.0, 2.0, 2.0), params, mask=mask, device="cpu")
    reuse = []
    for seeds, target in edits:
        fresh = prepare_metric(tensor, (2.0, 2.0, 2.0), params, mask=mask, device="cpu")
        a = connect(kept, seeds, target, radius=radius, device="cpu")
        b = connect(fresh, seeds, target, radius=radius, device="cpu")
        assert a.provenance["graph_edges"] == b.provenance["graph_edges"]
        np.testing.assert_array_equal(a.connected, b.connected)
        np.testing.assert_array_equal(a.distance_mm, b.distance_mm)
        np.testing.assert_array_equal(a.points, b.points)
        np.testing.assert_array_equal(a.cm, b.cm)
        reuse.append((a.provenance["graph_cached"], a.provenance["distances_cached"], a.provenance["extra_edges"],
                      int(a.connected.sum())))  # fmt: skip
    return reuse


@pytest.mark.parametrize("radius", [1, 2])
def test_graph_and_distances_are_reused_across_roi_edits_with_the_same_result(radius):
    """A seed moved inside the mask reuses the distance map; a new target reuses the graph;
    seeds and targets outside the mask add their own edges (for radius 2 also the longer
    steps across them) and still give exactly what a graph built from scratch gives."""
    _tensor, mask = _noisy_field()
    target = np.zeros(mask.shape, bool)
    target[15, 24:26, 14:17] = True
    other_target = np.zeros(mask.shape, bool)
    other_target[6:8, 15, 14:17] = True
    outside_target = np.zeros(mask.shape, bool)
    outside_target[12:14, 14:16, 15] = True  # in the hole of the mask, at its rim
    inside = np.array([[24.0, 15.0, 15.0], [24.5, 15.0, 15.0]])
    moved = np.array([[23.0, 16.0, 15.0], [22.0, 17.0, 16.0]])
    # in the hole, at its rim and one further in (joined through the other), and below the mask
    out = np.array([[12.0, 13.0, 15.0], [13.0, 13.0, 15.0], [24.0, 15.0, 3.0]])
    reuse = _fresh_and_reused(
        radius,
        [(inside, target), (moved, target), (moved, other_target), (out, other_target), (inside, outside_target)],
    )
    assert [r[:2] for r in reuse] == [
        (False, False),
        (True, True),  # the seed moved inside the mask: only the paths are read again
        (True, False),  # a new target: Dijkstra again on the same graph
        (True, False),
        (True, False),
    ]
    assert reuse[0][2] == reuse[1][2] == reuse[2][2] == 0
    assert reuse[3][2] > 0 and reuse[4][2] > 0  # voxels outside the mask brought edges of their own
    assert reuse[3][3] == 3 and reuse[4][3] == 2  # and join through them


def test_kept_graphs_are_bounded():
    from tractlens.gpu import geodesic_eikonal

    tensor, mask = _noisy_field()
    fld = prepare_metric(tensor, (2.0, 2.0, 2.0), MetricParams(metric="adjugate"), mask=mask, device="cpu")
    for i in range(geodesic_eikonal.DISTANCES_KEPT + 3):
        target = np.zeros(mask.shape, bool)
        target[15, 24:26, 14 + i % 3] = True
        target[5 + i, 15, 15] = True
        connect(fld, np.array([[24.0, 15.0, 15.0]]), target, device="cpu")
    kinds = [k[0] for k in fld.graphs]
    assert kinds.count("graph") == 1 and kinds.count("distances") == geodesic_eikonal.DISTANCES_KEPT


def test_a_live_edit_of_the_seed_reuses_the_metric_graph_and_distances_through_the_pipeline():
    """The window passes the metric field as a function of the resolved metric (kept per metric
    in the document): a second run after the seed region moved reads only the paths back."""
    from tractlens.app.pipelines.track import geodesic_pipeline

    from .test_geodesic_metrics import _straight_bundle

    field_, seed, target = _straight_bundle()
    made = {}

    def metric_field(metric):
        if metric not in made:
            made[metric] = prepare_metric(field_.tensor, field_.voxel_size, metric, device="cpu")
        return made[metric]

    first = geodesic_pipeline(field_, seed_mask=seed, target=target, device="cpu", metric_field=metric_field)
    moved = np.roll(seed, 1, axis=1) & field_.mask
    second = geodesic_pipeline(field_, seed_mask=moved, target=target, device="cpu", metric_field=metric_field)
    fresh = geodesic_pipeline(field_, seed_mask=moved, target=target, device="cpu")
    assert len(made) == 1  # the distance map's metric, made once
    assert (first.provenance["graph_cached"], first.provenance["distances_cached"]) == (False, False)
    assert (second.provenance["graph_cached"], second.provenance["distances_cached"]) == (True, True)
    np.testing.assert_array_equal(second.tractogram.points, fresh.tractogram.points)
    np.testing.assert_array_equal(second.tractogram.streamline_scalars["cm"], fresh.tractogram.streamline_scalars["cm"])
