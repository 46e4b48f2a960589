"""ROIs on an image's own grid (app.anatomy_layers): the brush at the image's resolution, shapes
drawn on the reference grid brought onto it, and every method's view of them on the DWI grid."""

import numpy as np
import pytest

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


def _registration(fixed: Grid, moving: Grid, shift_mm, *, warp: bool = False, template: bool = False):
    from tractlens.app.registration import Registration

    affine = np.eye(4)
    affine[:3, 3] = shift_mm  # fixed points -> moving points
    fields = {}
    if warp:  # a nonlinear registration whose field happens to be zero: the same answer by another path
        fields = {
            "warp": np.zeros((*fixed.shape, 3), np.float32),
            "inverse_warp": np.zeros((*fixed.shape, 3), np.float32),
        }
    return Registration(
        fixed,
        moving,
        affine,
        kind="syn" if warp else "rigid",
        fixed_name="mni" if template else "b0",
        moving_name="T1w",
        template="mni" if template else None,
        template_side="fixed" if template else None,
        **fields,
    )


def _blob_t1():
    affine = np.eye(4)
    affine[:3, 3] = -15.5
    t1 = Grid(affine, (32, 32, 32))  # 1 mm
    data = np.zeros(t1.shape, np.float32)
    data[18:22, 10:14, 15:19] = 100.0  # centred at voxel (19.5, 11.5, 16.5): RAS (4, -4, 1)
    return t1, data


def test_an_image_placed_by_a_linear_registration_keeps_its_voxels_and_moves():
    from tractlens.app.anatomy_layers import placed_layer

    t1, data = _blob_t1()
    dwi = _dwi_grid()
    registration = _registration(dwi, t1, [2.0, -1.0, 3.0])
    layer = Layer("T1w", Volume("T1w", data, t1.affine), "scalar", opacity=0.7)
    placed = placed_layer(layer, registration, "R1", dwi)
    assert placed.data.data is data and placed.opacity == 0.7
    centre = Grid.of(placed.data).to_mm([[19.5, 11.5, 16.5]])[0]
    np.testing.assert_allclose(centre, [4 - 2.0, -4 + 1.0, 1 - 3.0])  # moved back by the shift
    assert placed.provenance["registration"]["id"] == "R1"
    assert placed.provenance["registration"]["describe"] == registration.describe()


def test_an_image_placed_by_a_nonlinear_registration_is_resampled_at_its_own_resolution():
    from tractlens.app.anatomy_layers import placed_volume

    t1, data = _blob_t1()
    dwi = _dwi_grid()
    registration = _registration(dwi, t1, [2.0, -1.0, 3.0], warp=True)
    placed = placed_volume(Volume("T1w", data, t1.affine), registration, dwi)
    grid = Grid.of(placed)
    np.testing.assert_allclose(grid.voxel_sizes, 1.0)
    assert grid.shape == (24, 24, 20)
    weights = placed.data / placed.data.sum()
    centre = (grid.to_mm(np.argwhere(np.ones(grid.shape, bool))) * weights.reshape(-1, 1)).sum(0)
    np.testing.assert_allclose(centre, [2.0, -3.0, -2.0], atol=0.05)  # where the linear path puts it


def test_another_image_of_the_moving_space_is_placed_alike_and_one_elsewhere_is_refused():
    from tractlens.app.anatomy_layers import placed_volume

    t1, data = _blob_t1()
    registration = _registration(_dwi_grid(), t1, [2.0, -1.0, 3.0])
    fmri_affine = np.diag([3.0, 3.0, 3.0, 1.0])  # an fMRI map on a 3 mm grid of the T1's space
    fmri_affine[:3, 3] = [-12.0, -12.0, -12.0]
    fmri = placed_volume(Volume("fMRI", np.ones((9, 9, 9), np.float32), fmri_affine), registration, _dwi_grid())
    np.testing.assert_allclose(Grid.of(fmri).to_mm([[0, 0, 0]])[0], [-14.0, -11.0, -15.0])  # moved as the T1
    elsewhere = np.array(t1.affine)
    elsewhere[0, 3] += 500.0  # shares no space with the T1
    with pytest.raises(ValueError, match="lies outside the space this registration moves"):
        placed_volume(Volume("FLAIR", data, elsewhere), registration, _dwi_grid())


def test_mni_coordinate_of_a_subject_point_and_the_newest_template_registration():
    from tractlens.app.anatomy_layers import mni_coordinate, template_registration

    dwi = _dwi_grid()
    mni = Grid(
        np.diag([2.0, 2.0, 2.0, 1.0]) @ np.array([[1, 0, 0, -45], [0, 1, 0, -63], [0, 0, 1, -36], [0, 0, 0, 1.0]]),
        (91, 109, 91),
    )
    to_t1 = _registration(dwi, dwi, [1, 1, 1])
    to_mni = _registration(mni, dwi, [-4.0, 3.0, -2.0], template=True)  # MNI point p is subject point p + shift
    assert template_registration([to_t1]) is None and mni_coordinate(None, [0, 0, 0]) is None
    assert template_registration([to_mni, to_t1]) is to_mni
    np.testing.assert_allclose(mni_coordinate(to_mni, [10.0, 0.0, 5.0]), [14.0, -3.0, 7.0])


def test_a_placed_image_reopened_from_a_session_is_registered_again_from_the_scan():
    from tractlens.app.anatomy_layers import as_scanned, placed_layer
    from tractlens.app.session import snapshot_layer

    t1, data = _blob_t1()
    layer = Layer("T1w", Volume("T1w", data, t1.affine), "scalar")
    placed = placed_layer(layer, _registration(_dwi_grid(), t1, [2.0, -1.0, 3.0]), "R1", _dwi_grid())
    reopened = snapshot_layer(placed)  # what a session keeps: the placed voxels and the provenance
    scan = as_scanned(reopened)
    np.testing.assert_allclose(scan.affine, t1.affine)
    assert scan.data is data
    assert as_scanned(layer) is layer.data


def test_an_roi_drawn_on_a_placed_image_is_saved_in_that_image_s_scanner_space():
    from tractlens.app.anatomy_layers import new_roi_on, placed_layer, roi_in_scanner_space
    from tractlens.app.errors import InputError

    t1, data = _blob_t1()
    layer = Layer("T1w", Volume("T1w", data, t1.affine), "scalar")
    placed = placed_layer(layer, _registration(_dwi_grid(), t1, [2.0, -1.0, 3.0]), "R1", _dwi_grid())
    lesion = new_roi_on(placed, "lesion", "lesion")
    lesion.data.mask[18:22, 10:14, 15:19] = True
    mask, affine = roi_in_scanner_space(lesion)
    np.testing.assert_allclose(affine, t1.affine)
    assert mask.sum() == 64
    plain = new_roi_on(layer, "seed", "seed")  # drawn on an image nothing registered: one space only
    with pytest.raises(InputError, match="no other space"):
        roi_in_scanner_space(plain)


@pytest.mark.parametrize("nonlinear", [False, True])
def test_an_roi_drawn_on_an_image_follows_it_when_it_is_placed(nonlinear):
    from tractlens.app.anatomy_layers import new_roi_on, placed_layer, roi_following

    t1, data = _blob_t1()
    layer = Layer("T1w", Volume("T1w", data, t1.affine), "scalar")
    lesion = new_roi_on(layer, "lesion", "lesion")
    lesion.data.mask[18:22, 10:14, 15:19] = True  # on the blob: RAS (4, -4, 1) in the T1's scanner space
    registration = _registration(_dwi_grid(), t1, [2.0, -1.0, 3.0], warp=nonlinear)
    placed = placed_layer(layer, registration, "R1", _dwi_grid())
    moved = roi_following(lesion, layer, placed, registration, _dwi_grid())
    centre = Grid.of(moved.data).to_mm(np.argwhere(moved.data.mask)).mean(0)
    np.testing.assert_allclose(centre, [2.0, -3.0, -2.0], atol=0.01)  # moved as the image was
    assert abs(int(moved.data.mask.sum()) - 64) <= (0 if not nonlinear else 16)
    assert moved.provenance["registration"]["id"] == "R1" and moved.data.role == "lesion"
    other = new_roi_on(Layer("FA", Volume("FA", data, t1.affine), "scalar"), "seed", "seed")
    assert roi_following(other, layer, placed, registration, _dwi_grid()) is None  # drawn on another image


def test_a_layer_chosen_as_a_registration_mask_is_taken_in_its_image_s_scanner_space():
    from tractlens.app.anatomy_layers import mask_as_scanned
    from tractlens.app.model import Volume

    scanner = np.diag([1.0, 1.0, 1.0, 1.0])
    scanner[:3, 3] = (3.0, -2.0, 1.5)
    placed_affine = np.eye(4)
    mask = np.zeros((6, 6, 6), bool)
    mask[2:4, 2:4, 2:4] = True
    roi = Layer("brain", RoiMask("brain", mask, placed_affine, role="seed"), "roi")
    roi.provenance = {"scanner_affine": scanner.tolist()}  # drawn on a T1 placed by a linear registration
    taken = mask_as_scanned(roi)
    np.testing.assert_array_equal(taken.mask, mask)
    np.testing.assert_array_equal(taken.affine, scanner)
    mask[0, 0, 0] = True  # painting goes on while the registration runs: the copy keeps what was chosen
    assert not taken.mask[0, 0, 0]
    plain = Layer("dwi roi", RoiMask("dwi roi", mask, placed_affine, role="seed"), "roi")
    np.testing.assert_array_equal(mask_as_scanned(plain).affine, placed_affine)
    image = Layer("labels", Volume("labels", mask.astype(np.int16), placed_affine, kind="labels"), "labels")
    assert mask_as_scanned(image) is image.data  # an image not placed by a registration: as it is
