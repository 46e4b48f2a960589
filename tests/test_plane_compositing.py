"""The slice planes' compositing (widgets.render, no Qt): a plane read as a slice of a layer's
array gives the same pixels as one voxel gathered per pixel, and an ROI stroke patched into a
composited plane gives the same image as compositing the whole plane again."""

import numpy as np
import pytest

from tractlens.app.document import Document
from tractlens.app.layers import Layer
from tractlens.app.volumes import RoiMask, Volume
from tractlens.widgets.render import (
    VIEWS,
    composite,
    patch_stroke,
    plane_geometry,
    sample_layer,
    sample_plane,
)

SHAPE = (14, 11, 9)
# Voxel axes permuted and flipped against RAS (j runs to the left, k backwards, i up): every view
# reads its plane against the array's own order.
AFFINE = np.array([[0.0, -2.0, 0.0, 30.0], [0.0, 0.0, -2.0, 20.0], [2.0, 0.0, 0.0, -10.0], [0.0, 0.0, 0.0, 1.0]])


def document(affine=AFFINE) -> Document:
    rng = np.random.default_rng(0)
    doc = Document()
    doc.add_layer(Layer("anat", Volume("anat", rng.uniform(0, 100, SHAPE).astype(np.float32), affine), "scalar"))
    rgb = rng.uniform(0, 1, (*SHAPE, 3)).astype(np.float32)
    doc.add_layer(Layer("colour", Volume("colour", rgb, affine), "rgb", opacity=0.5))
    labels = rng.integers(0, 4, SHAPE).astype(np.int16)
    doc.add_layer(Layer("labels", Volume("labels", labels, affine), "labels", opacity=0.4))
    mask = np.zeros(SHAPE, bool)
    mask[3:8, 2:6, 4] = True
    doc.add_layer(Layer("seed", RoiMask("seed", mask, affine, role="seed"), "roi"))
    doc.cursor = np.array([5, 4, 4])
    return doc


@pytest.mark.parametrize("radiological", [False, True])
@pytest.mark.parametrize("view", list(VIEWS))
def test_a_plane_read_as_a_slice_equals_one_voxel_gathered_per_pixel(view, radiological):
    doc = document()
    geometry = plane_geometry(doc, view, radiological)
    for part in (geometry, _part(geometry, slice(1, 4), slice(2, 7))):  # the whole plane and a rectangle of it
        for layer in doc.layers:
            values, inside = sample_plane(layer, doc, part)
            expected, expected_inside = sample_layer(layer, doc, part.voxels)
            np.testing.assert_array_equal(values, expected)
            np.testing.assert_array_equal(inside, expected_inside)


def _part(geometry, rows, cols):
    from dataclasses import replace

    return replace(geometry, voxels=geometry.voxels[rows, cols])


def _stroke(doc, layer, voxels, value=True):
    """Paint as a brush does; returns the voxels the ``roi`` event said it changed."""
    said = []
    doc.connect(lambda _source, event, **info: event == "roi" and said.append(info.get("voxels")))
    doc.paint(layer, voxels, value)
    return said[-1]


@pytest.mark.parametrize("view", list(VIEWS))
def test_a_stroke_patched_into_a_plane_equals_the_plane_composited_again(view):
    doc = document()
    seed = doc.layer("seed")
    geometry = plane_geometry(doc, view)
    image = composite(doc, geometry)
    # a stroke through the cursor (on every plane), painting and erasing
    voxels = np.array([[8, 4, 4], [5, 6, 4], [9, 7, 4], [2, 4, 4], [5, 9, 4], [5, 4, 1]])
    changed = _stroke(doc, seed, voxels)
    assert len(changed) == len(voxels)
    assert patch_stroke(doc, geometry, image, seed, changed) is True
    np.testing.assert_array_equal(image, composite(doc, geometry))
    changed = _stroke(doc, seed, [[4, 3, 4], [5, 4, 4]], False)
    assert patch_stroke(doc, geometry, image, seed, changed) is True
    np.testing.assert_array_equal(image, composite(doc, geometry))
    said = []  # an undo says the voxels it restored too
    doc.connect(lambda _source, event, **info: event == "roi" and said.append(info.get("voxels")))
    assert doc.undo()
    assert len(said[-1]) == 2 and patch_stroke(doc, geometry, image, seed, said[-1]) is True
    np.testing.assert_array_equal(image, composite(doc, geometry))


def test_a_stroke_off_a_plane_leaves_it_as_it_is():
    doc = document()
    seed = doc.layer("seed")
    geometry = plane_geometry(doc, "axial")  # the voxels with k = cursor k (4) here
    axis = geometry.normal_axis
    image = composite(doc, geometry)
    before = image.copy()
    off = np.array([[2, 2, 2], [3, 2, 2]])
    off[:, axis] = (doc.cursor[axis] + 2) % SHAPE[axis]
    changed = _stroke(doc, seed, off)
    assert patch_stroke(doc, geometry, image, seed, changed) is False
    np.testing.assert_array_equal(image, before)
    np.testing.assert_array_equal(image, composite(doc, geometry))


def test_a_finer_image_shows_the_stroke_at_its_sub_pixels():
    """A visible image finer than the reference grid composites 2 sub-pixels a voxel each way:
    the stroke's rectangle is patched at that resolution."""
    doc = document(np.diag([2.0, 2.0, 2.0, 1.0]))
    fine = np.random.default_rng(1).uniform(0, 1, tuple(2 * n for n in SHAPE)).astype(np.float32)
    doc.add_layer(Layer("T1", Volume("T1", fine, np.diag([1.0, 1.0, 1.0, 1.0])), "scalar", opacity=0.5), index=1)
    seed = doc.layer("seed")
    geometry = plane_geometry(doc, "coronal")
    image = composite(doc, geometry, 2)
    assert image.shape[:2] == tuple(2 * n for n in geometry.voxels.shape[:2])
    changed = _stroke(doc, seed, [[5, 4, 4], [6, 4, 5], [7, 4, 6]])
    assert patch_stroke(doc, geometry, image, seed, changed) is True
    np.testing.assert_array_equal(image, composite(doc, geometry, 2))


def test_what_a_stroke_cannot_patch_is_composited_again():
    """An edit without its voxels (a shape), an ROI on another grid, and an image drawn as its
    edges (a changed voxel changes its neighbours' pixels) ask for the whole plane."""
    doc = document()
    seed = doc.layer("seed")
    geometry = plane_geometry(doc, "axial")
    image = composite(doc, geometry)
    assert patch_stroke(doc, geometry, image, seed, None) is None
    other = Layer("other", RoiMask("other", np.zeros((7, 6, 5), bool), np.diag([4.0, 4, 4, 1])), "roi")
    doc.add_layer(other)
    assert patch_stroke(doc, geometry, image, other, _stroke(doc, other, [[1, 1, 1]])) is None
    doc.layer("anat").set(alignment="edges")
    assert patch_stroke(doc, geometry, image, seed, _stroke(doc, seed, [[0, 0, 4]])) is None
