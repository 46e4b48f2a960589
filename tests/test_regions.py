"""ROI roles mean one thing to every tracking method (app.regions), and the pipelines use them so."""

import numpy as np
import pytest

from tractlens.app.derived import DerivedCache
from tractlens.app.grid import Grid
from tractlens.app.model import Document, Layer, RoiMask, Volume
from tractlens.app.regions import RoiCopy, regions_for, regions_on_grid

SHAPE = (10, 12, 8)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


def box(lo, hi, shape=SHAPE):
    mask = np.zeros(shape, bool)
    mask[tuple(slice(a, b) for a, b in zip(lo, hi))] = True
    return mask


def document_with(*rois):
    """A document on SHAPE/AFFINE holding ``rois``: (name, role, mask[, visible])."""
    doc = Document()
    doc.add_layer(Layer("fa", Volume("fa", np.zeros(SHAPE, np.float32), AFFINE), "scalar"))
    for name, role, mask, *visible in rois:
        layer = Layer(name, RoiMask(name, mask, AFFINE, role=role), "roi")
        doc.add_layer(layer)
        if visible and not visible[0]:
            layer.set(visible=False)
    return doc


def test_roles_unions_and_separate_targets_and_waypoints():
    a, b = box((1, 1, 1), (3, 3, 3)), box((5, 5, 5), (7, 7, 7))
    t1, t2, w = box((8, 0, 0), (10, 2, 2)), box((0, 10, 0), (2, 12, 2)), box((4, 4, 0), (5, 5, 1))
    ex1, ex2, st = box((0, 0, 6), (1, 1, 8)), box((9, 11, 7), (10, 12, 8)), box((3, 3, 3), (4, 4, 4))
    doc = document_with(
        ("s1", "seed", a), ("s2", "seed", b), ("left", "target", t1), ("right", "target", t2),
        ("via", "waypoint", w), ("x1", "exclusion", ex1), ("x2", "exclusion", ex2), ("halt", "stop", st),
    )  # fmt: skip
    regions = regions_for(doc, "probabilistic", (AFFINE, SHAPE))
    assert np.array_equal(regions.seed, a | b)
    assert regions.seed_names == ["s1", "s2"]
    assert [r.name for r in regions.targets] == ["left", "right"]
    assert np.array_equal(regions.targets[0].mask, t1) and np.array_equal(regions.targets[1].mask, t2)
    assert [r.name for r in regions.waypoints] == ["via"] and np.array_equal(regions.waypoints[0].mask, w)
    assert np.array_equal(regions.exclusion, ex1 | ex2)
    assert np.array_equal(regions.stop, st)
    # Deterministic: every target and every waypoint is passed (AND), never merged.
    must = regions_for(doc, "deterministic", (AFFINE, SHAPE)).must_pass
    assert len(must) == 3
    assert [m.sum() for m in must] == [t1.sum(), t2.sum(), w.sum()]
    assert np.array_equal(regions.target_union, t1 | t2)
    assert regions.notes == []


def test_hidden_and_empty_rois_take_no_part():
    seed = box((1, 1, 1), (3, 3, 3))
    doc = document_with(
        ("seed", "seed", seed),
        ("hidden seed", "seed", box((6, 6, 6), (8, 8, 8)), False),
        ("empty target", "target", np.zeros(SHAPE, bool)),
        ("hidden exclusion", "exclusion", box((0, 0, 0), (1, 1, 1)), False),
    )
    regions = regions_for(doc, "deterministic", (AFFINE, SHAPE))
    assert np.array_equal(regions.seed, seed)
    assert regions.targets == [] and regions.exclusion is None and regions.stop is None
    assert regions.must_pass == [] and regions.target_union is None


def test_rois_on_another_grid_are_resampled_with_a_note():
    seed = box((2, 2, 2), (6, 6, 6))
    doc = document_with(("seed", "seed", seed), ("target", "target", box((6, 6, 1), (8, 8, 3))))
    # The tensor grid: half the resolution (4 mm), shifted by one of its voxels.
    coarse = np.diag([4.0, 4.0, 4.0, 1.0])
    coarse[:3, 3] = 4.0
    grid = Grid(coarse, (5, 6, 4))
    regions = regions_for(doc, "geodesic", grid)
    expected = grid.resample_nearest(seed, Grid(AFFINE, SHAPE))
    assert regions.seed.shape == (5, 6, 4)
    assert np.array_equal(regions.seed, expected) and regions.seed.any()
    assert regions.targets[0].mask.shape == (5, 6, 4)
    assert sum("resampled" in note for note in regions.notes) == 2
    assert any("seed" in note for note in regions.notes)


def test_an_roi_within_the_tolerance_of_the_grid_is_used_as_it_is():
    nudged = AFFINE.copy()
    nudged[0, 3] += Grid.TOLERANCE / 2
    mask = box((1, 1, 1), (2, 2, 2))
    regions = regions_on_grid([RoiCopy("s", "seed", mask, nudged)], "deterministic", (AFFINE, SHAPE))
    assert np.array_equal(regions.seed, mask) and regions.notes == []


def test_an_roi_outside_the_grid_is_left_out_with_a_note():
    far = AFFINE.copy()
    far[:3, 3] = 500.0  # half a metre away: no voxel of it lands on the grid
    rois = [
        RoiCopy("seed", "seed", box((1, 1, 1), (3, 3, 3)), AFFINE),
        RoiCopy("far target", "target", box((0, 0, 0), (3, 3, 3)), far),
    ]
    regions = regions_on_grid(rois, "deterministic", (AFFINE, SHAPE))
    assert regions.targets == [] and regions.must_pass == []
    assert regions.notes == ["ROI far target lies outside the deterministic tracking grid: left out"]


def test_an_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown tracking method"):
        regions_on_grid([], "tensorline", (AFFINE, SHAPE))


def test_the_snapshot_is_a_copy():
    mask = box((1, 1, 1), (3, 3, 3))
    doc = document_with(("seed", "seed", mask))
    voxels = int(mask.sum())
    regions = regions_for(doc, "deterministic", (AFFINE, SHAPE))
    doc.layer("seed").data.mask[:] = False
    assert int(regions.seed.sum()) == voxels


def test_deterministic_tracking_keeps_only_streamlines_that_pass_every_target():
    """Straight fibres along x; one target covers y < 4 at the left end, the other y >= 2 at the
    right end. AND (every target passed) keeps the fibres with 2 <= y < 4 only; the OR that the
    panel's merged reading would amount to keeps them all."""
    from tractlens.app.pipelines.track import TensorField, deterministic_from_regions
    from tractlens.gpu.select import select_streamlines

    shape = (40, 6, 3)
    tensor = np.zeros((*shape, 6), np.float32)
    tensor[..., 0], tensor[..., 3], tensor[..., 5] = 1.7e-3, 0.3e-3, 0.3e-3  # along x everywhere
    field_ = TensorField.from_tensor(tensor, np.eye(4))
    seed = box((19, 0, 0), (21, 6, 3), shape)
    left, right = box((2, 0, 0), (3, 4, 3), shape), box((37, 2, 0), (38, 6, 3), shape)

    def track(*targets):
        rois = [RoiCopy("s", "seed", seed, np.eye(4))]
        rois += [RoiCopy(f"t{i}", "target", m, np.eye(4)) for i, m in enumerate(targets)]
        return deterministic_from_regions(field_, regions_on_grid(rois, "deterministic", field_), device="cpu")

    alone, both = track(), track(left, right)
    kept = both.tractogram
    assert 0 < len(kept) < len(alone.tractogram)
    assert select_streamlines(kept.points, kept.offsets, [left, right], device="cpu").selected.all()
    y = np.rint(kept.points[:, 1])
    assert y.min() >= 2 and y.max() <= 3
    assert both.provenance["streamlines_removed_by_rois"] == len(alone.tractogram) - len(kept)


def test_derived_fields_are_computed_once_per_volume():
    from tractlens.app.pipelines.track import tensor_field_of

    class Doc:
        derived = DerivedCache()

    tensor = np.zeros((4, 4, 4, 6), np.float32)
    tensor[..., 0] = tensor[..., 3] = tensor[..., 5] = 1e-3
    volume = Volume("tensor", tensor, np.eye(4), kind="tensor")
    first = tensor_field_of(Doc, volume)
    assert tensor_field_of(Doc, volume) is first
    assert tensor_field_of(Doc, Volume("other", tensor.copy(), np.eye(4), kind="tensor")) is not first


def test_geodesic_tracking_keeps_only_fibres_through_every_waypoint():
    """A waypoint drops the fibres that miss it, batch by batch, and the fibres kept pass it."""
    from tractlens.app.pipelines.track import TensorField, geodesic_from_regions
    from tractlens.gpu.select import select_streamlines

    shape = (24, 8, 8)
    tensor = np.zeros((*shape, 6), np.float32)
    tensor[..., 0], tensor[..., 3], tensor[..., 5] = 1.7e-3, 0.3e-3, 0.3e-3
    field_ = TensorField.from_tensor(tensor, np.eye(4))
    seed = box((11, 3, 3), (13, 5, 5), shape)
    waypoint = box((18, 0, 0), (19, 8, 8), shape)  # the right half of the fibres only
    rois = [RoiCopy("s", "seed", seed, np.eye(4))]
    free = geodesic_from_regions(field_, regions_on_grid(rois, "geodesic", field_), directions=20, device="cpu")
    rois.append(RoiCopy("w", "waypoint", waypoint, np.eye(4)))
    kept = geodesic_from_regions(field_, regions_on_grid(rois, "geodesic", field_), directions=20, device="cpu")
    tract = kept.tractogram
    assert 0 < len(tract) < len(free.tractogram)
    assert select_streamlines(tract.points, tract.offsets, [waypoint], device="cpu").selected.all()
    assert kept.provenance["streamlines_removed_by_rois"] == len(free.tractogram) - len(tract)
    assert len(tract.streamline_scalars["cm"]) == len(tract)


def test_affines_match_with_the_one_grid_tolerance():
    """The loaders' and views' same-placement test is Grid's: within TOLERANCE, not beyond."""
    near, far = AFFINE.copy(), AFFINE.copy()
    near[1, 3] += 0.9 * Grid.TOLERANCE
    far[1, 3] += 1.1 * Grid.TOLERANCE
    assert Grid.affines_match(AFFINE, near)
    assert not Grid.affines_match(AFFINE, far)
    assert Grid(AFFINE, SHAPE).same_placement((far, (3, 3, 3))) is False


def test_geodesic_fibres_reach_any_target_and_each_is_ranked_where_it_first_does():
    """Targets at both ends of a straight bundle: a fibre ends in the first target it enters, so
    the fibres to either target are kept (requiring both would keep none)."""
    from tractlens.app.pipelines.track import TensorField, geodesic_from_regions

    shape = (24, 8, 8)
    tensor = np.zeros((*shape, 6), np.float32)
    tensor[..., 0], tensor[..., 3], tensor[..., 5] = 1.7e-3, 0.3e-3, 0.3e-3
    field_ = TensorField.from_tensor(tensor, np.eye(4))
    seed = box((11, 3, 3), (13, 5, 5), shape)
    left, right = box((2, 0, 0), (3, 8, 8), shape), box((20, 0, 0), (21, 8, 8), shape)
    rois = [RoiCopy("s", "seed", seed, np.eye(4)), RoiCopy("left", "target", left, np.eye(4))]
    to_left = geodesic_from_regions(
        field_, regions_on_grid(rois, "geodesic", field_), directions=40, device="cpu", method="rays"
    )
    rois.append(RoiCopy("right", "target", right, np.eye(4)))
    to_either = geodesic_from_regions(
        field_, regions_on_grid(rois, "geodesic", field_), directions=40, device="cpu", method="rays"
    )
    assert 0 < len(to_left.tractogram) < len(to_either.tractogram)
    ends = to_either.tractogram.points[to_either.tractogram.offsets[1:] - 1]
    end_voxels = np.rint(ends).astype(int)
    in_target = (left | right)[tuple(end_voxels.T)]
    assert in_target.all()
    assert (ends[:, 0] < 12).any() and (ends[:, 0] > 12).any()  # both targets reached
