"""The probabilistic panel's isosurface pieces without a window: the worker's crop of the path
distribution (one pass over the grid), the coarse surface of a first pass, an ROI's box, and
the document listener that hears a stroke first."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from tractlens.app.volumes import RoiMask
from tractlens.widgets import probabilistic_panel as module

AFFINE = np.array([[1.25, 0, 0, -90.0], [0, 1.25, 0, -126.0], [0, 0, 1.25, -72.0], [0, 0, 0, 1.0]])


def brute_force_crop(paths: np.ndarray, percent: float):
    """The box of every voxel at or above the level, one voxel of margin (within the grid)."""
    top = int(paths.max())
    level = top * percent / 100.0
    hits = np.argwhere(paths >= level)
    lo = np.maximum(hits.min(axis=0) - 1, 0)
    hi = np.minimum(hits.max(axis=0) + 2, paths.shape)
    return top, level, lo, paths[tuple(slice(a, b) for a, b in zip(lo, hi))]


def gaussian_counts(shape=(100, 100, 100), sigma=14.0, top=1000) -> np.ndarray:
    """A smooth path distribution: counts falling off from the grid's centre."""
    grid = np.indices(shape).astype(np.float64)
    r2 = sum((g - (n - 1) / 2) ** 2 for g, n in zip(grid, shape))
    return np.rint(top * np.exp(-r2 / (2 * sigma**2))).astype(np.int64)


def values_on(mesh, volume: np.ndarray, origin, step: int) -> np.ndarray:
    """``volume`` (whose voxel 0 sits at grid voxel ``origin``, ``step`` voxels apart),
    trilinearly interpolated at the surface's points (world mm, :data:`AFFINE`)."""
    ijk = (np.asarray(mesh.points, np.float64) - AFFINE[:3, 3]) @ np.linalg.inv(AFFINE[:3, :3]).T
    return ndimage.map_coordinates(volume.astype(np.float64), ((ijk - origin) / step).T, order=1, mode="constant")


@pytest.mark.parametrize("percent", [5.0, 50.0, 100.0])
def test_the_crop_is_the_box_of_the_voxels_at_the_level_with_a_closed_edge(percent):
    rng = np.random.default_rng(3)
    paths = np.zeros((40, 37, 31), np.int64)
    voxels = rng.integers(0, (40, 37, 31), size=(300, 3))
    paths[tuple(voxels.T)] = rng.integers(1, 500, size=300)
    paths[0, 5, 7] = paths.max()  # a peak on the grid's edge: the margin stops there
    top, level, lo, crop = brute_force_crop(paths, percent)
    iso = module.isosurface_input(paths, percent)
    assert (iso.top, iso.step) == (top, 1) and iso.level == pytest.approx(level)
    assert iso.volume.dtype == np.float32
    np.testing.assert_array_equal(iso.volume, np.pad(crop, 1))  # zero all round: the surface closes
    np.testing.assert_array_equal(iso.origin, lo - 1)


def test_an_empty_distribution_has_no_surface():
    iso = module.isosurface_input(np.zeros((8, 9, 10), np.int64), 5.0, coarse=True)
    assert iso.volume is None and iso.top == 0
    assert module.isosurface(iso, AFFINE) is None


def test_a_first_pass_surface_keeps_every_second_voxel_of_a_large_crop_in_the_same_place():
    paths = gaussian_counts()
    fine = module.isosurface_input(paths, 5.0)
    coarse = module.isosurface_input(paths, 5.0, coarse=True)
    _top, level, lo, crop = brute_force_crop(paths, 5.0)
    assert crop.size > module.COARSE_SURFACE_VOXELS  # large enough to be made coarse
    assert (fine.step, coarse.step) == (1, module.COARSE_STEP) and coarse.level == fine.level == level
    np.testing.assert_array_equal(coarse.volume, np.pad(crop[::2, ::2, ::2], 1))
    np.testing.assert_array_equal(coarse.origin, lo - 2)
    fine_mesh, coarse_mesh = module.isosurface(fine, AFFINE), module.isosurface(coarse, AFFINE)
    assert coarse_mesh.n_points < fine_mesh.n_points / 3  # far less to march and to draw
    # Each surface lies where its own grid crosses the level…
    np.testing.assert_allclose(values_on(fine_mesh, fine.volume, fine.origin, 1), level, rtol=1e-3)
    np.testing.assert_allclose(values_on(coarse_mesh, coarse.volume, coarse.origin, 2), level, rtol=1e-3)
    # …and the coarse one within a voxel of the level on the full grid: the same surface, coarser
    # (there the Gaussian's counts fall by level × r / σ² a voxel, r its radius at the level).
    sigma = 14.0
    per_voxel = level * sigma * np.sqrt(2 * np.log(1000 / level)) / sigma**2
    on_grid = values_on(coarse_mesh, paths, np.zeros(3), 1)
    assert np.abs(on_grid - level).max() < per_voxel
    np.testing.assert_allclose(coarse_mesh.bounds, fine_mesh.bounds, atol=2 * 1.25)


def test_a_small_crop_stays_full_even_for_a_first_pass():
    paths = gaussian_counts((40, 40, 40), sigma=4.0)
    _top, _level, lo, crop = brute_force_crop(paths, 5.0)
    iso = module.isosurface_input(paths, 5.0, coarse=True)
    assert crop.size <= module.COARSE_SURFACE_VOXELS and iso.step == 1
    np.testing.assert_array_equal(iso.volume, np.pad(crop, 1))
    np.testing.assert_array_equal(iso.origin, lo - 1)


def test_an_rois_box_is_the_bounding_box_of_its_voxels():
    mask = np.zeros((30, 20, 10), bool)
    mask[[3, 17, 9], [15, 2, 8], [0, 9, 4]] = True
    box = RoiMask("r", mask, AFFINE).box()
    assert box == (slice(3, 18), slice(2, 16), slice(0, 10))
    assert mask[box].sum() == mask.sum()
    assert RoiMask("empty", np.zeros((4, 4, 4), bool), AFFINE).box() is None


def test_a_listener_connected_first_hears_a_change_before_the_others():
    from tractlens.app.observable import Observable

    source, heard = Observable(), []
    source.connect(lambda *_a, **_k: heard.append("view"))
    source.connect(lambda *_a, **_k: heard.append("live panel"), first=True)
    source.connect(lambda *_a, **_k: heard.append("later view"))
    source.emit("roi")
    assert heard == ["live panel", "view", "later view"]
