"""ROIs on an image's own grid (app.anatomy_layers): the brush at the image's resolution, shapes
drawn on the reference grid brought onto it, and every method's view of them on the DWI grid."""

import numpy as np

from tractlens.app.anatomy_layers import brush_voxels, covering_voxels, fine_grid, roi_on_grid
from tractlens.app.grid import Grid
from tractlens.app.model import Document, Layer, RoiMask, Volume


def _dwi_grid(shape=(12, 12, 10), voxel=2.0, origin=(-11.0, -11.0, -9.0)) -> Grid:
    affine = np.diag([voxel, voxel, voxel, 1.0])
    affine[:3, 3] = origin
    return Grid(affine, shape)


def test_fine_grid_covers_the_reference_field_of_view_at_the_image_resolution():
    coarse = _dwi_grid()
    fine = fine_grid(coarse, [1.0, 1.0, 1.0])
    assert fine.shape == (24, 24, 20)
    np.testing.assert_allclose(fine.voxel_sizes, 1.0)
    # the corners of both grids' fields of view coincide (within float rounding)
    np.testing.assert_allclose(fine.to_mm([[-0.5, -0.5, -0.5]]), coarse.to_mm([[-0.5, -0.5, -0.5]]), atol=1e-9)
    np.testing.assert_allclose(fine.to_mm([[23.5, 23.5, 19.5]]), coarse.to_mm([[11.5, 11.5, 9.5]]), atol=1e-9)


def test_a_click_paints_the_image_voxels_inside_the_reference_voxel():
    coarse = _dwi_grid()
    fine = fine_grid(coarse, 1.0)
    painted = brush_voxels(fine, coarse, [[5, 6, 4]], 0, normal_axis=2)
    expected = {(i, j, k) for i in (10, 11) for j in (12, 13) for k in (8, 9)}
    assert {tuple(v) for v in painted.tolist()} == expected


def test_a_brush_paints_a_disc_in_mm_at_the_image_resolution():
    coarse = _dwi_grid(shape=(20, 20, 10))
    fine = fine_grid(coarse, 1.0)
    radius_voxels = 3  # 6 mm on the 2 mm grid
    painted = brush_voxels(fine, coarse, [[10, 10, 5]], radius_voxels, normal_axis=2)
    centre_mm = coarse.to_mm([[10, 10, 5]])[0]
    offsets = fine.to_mm(painted) - centre_mm
    assert np.all(np.hypot(offsets[:, 0], offsets[:, 1]) <= 6.0 + 1e-9)
    assert set(np.unique(painted[:, 2])) == {10, 11}  # the two 1 mm slices in the 2 mm slice
    per_slice = len(painted) / 2
    assert abs(per_slice - np.pi * 36) / (np.pi * 36) < 0.1  # a disc of 6 mm at 1 mm: ~113 voxels
    # the disc's edge is drawn at 1 mm, not in 2 mm steps: a voxel 5.5 mm off-centre is in
    assert np.any(np.isclose(np.abs(offsets[:, 0]), 5.5) & np.isclose(offsets[:, 1], 0.5))


def test_a_rectangle_on_the_reference_grid_covers_its_image_voxels_and_comes_back_the_same():
    coarse = _dwi_grid()
    fine = fine_grid(coarse, 1.0)
    rect = np.array([(i, j, 3) for i in range(2, 6) for j in range(4, 7)])
    on_fine = covering_voxels(fine, coarse, rect)
    assert len(on_fine) == 8 * len(rect)
    mask = np.zeros(fine.shape, dtype=bool)
    mask[tuple(on_fine.T)] = True
    back = roi_on_grid(mask, fine.affine, coarse)
    expected = np.zeros(coarse.shape, dtype=bool)
    expected[tuple(rect.T)] = True
    np.testing.assert_array_equal(back, expected)


def test_fibre_selection_sees_an_roi_drawn_on_another_grid_on_the_reference_grid():
    coarse = _dwi_grid()
    fine = fine_grid(coarse, 1.0)
    doc = Document()
    doc.add_layer(Layer("FA", Volume("FA", np.ones(coarse.shape, np.float32), coarse.affine), "scalar"))
    mask = np.zeros(fine.shape, dtype=bool)
    mask[10:14, 10:14, 8:10] = True  # reference voxels (5..6, 5..6, 4)
    doc.add_layer(Layer("seed on T1", RoiMask("seed on T1", mask, fine.affine, role="seed"), "roi"))
    include, exclude = doc.roi_sets()
    assert exclude == [] and len(include) == 1
    assert include[0].shape == coarse.shape
    assert {tuple(v) for v in np.argwhere(include[0]).tolist()} == {(i, j, 4) for i in (5, 6) for j in (5, 6)}
    assert doc.roi_masks_by_role()["seed"][0].shape == coarse.shape
