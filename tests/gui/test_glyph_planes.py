"""The 3-D tensor glyphs built plane by plane, the planes a slice step did not move from a cache
(issue 41: whole-slice glyphs within 100 ms a step): the same glyphs as built from all three
planes at once, whatever the cache holds, and only the moved plane computed again."""

import numpy as np
import pytest

from tractlens.app.display_data import tensors_to_world
from tractlens.widgets import glyph_planes
from tractlens.widgets.glyph_instances import instance_arrays, joined_instances
from tractlens.widgets.glyph_planes import (
    cursor_plane_tensors,
    plane_choices,
    plane_grid_voxels,
    sample_volume,
)

SHAPE = (23, 19, 17)


def tensor_volume(rng, shape=SHAPE):
    """Random positive tensors (xx xy xz yy yz zz), a quarter of the voxels unfitted (zeros)."""
    a = rng.normal(size=(*shape, 3, 3))
    m = a @ np.swapaxes(a, -1, -2) * 1e-3 + np.eye(3) * 1e-4
    data = np.stack([m[..., 0, 0], m[..., 0, 1], m[..., 0, 2], m[..., 1, 1], m[..., 1, 2], m[..., 2, 2]], -1)
    data[rng.random(shape) < 0.25] = 0.0
    return data.astype(np.float32)


def all_at_once(data, affine, reference, cursor, step, look):
    """The glyph arrays built from the three planes' voxels together (as before the cache)."""
    voxels = plane_grid_voxels(SHAPE, cursor, step)
    values, inside = sample_volume(data, affine, reference, voxels)
    keep = inside & (values[:, 0] + values[:, 3] + values[:, 5] > 0)
    centres = voxels[keep] @ reference[:3, :3].T + reference[:3, 3]
    world = tensors_to_world(values[keep].astype(np.float64), affine)
    return instance_arrays(world, centres, shape=look[0], size_mm=1.5, resolution=8, colour=look[1])


def by_planes(data, affine, reference, cursor, step, look):
    """The glyph arrays built plane by plane, in the voxels' order (as :func:`all_at_once`)."""
    glyphs = cursor_plane_tensors(data, affine, reference, SHAPE, cursor, step, look)
    assert len(np.unique(glyphs["linear"])) == len(glyphs["linear"])  # each voxel once
    order = np.argsort(glyphs["linear"])
    glyphs = {name: values[order] for name, values in glyphs.items()}
    return joined_instances(glyphs, glyphs["centres"], shape=look[0], size_mm=1.5, resolution=8)


def assert_same(a, b):
    np.testing.assert_array_equal(a["points"], b["points"])
    assert list(a["point_data"]) == list(b["point_data"])
    for name in a["point_data"]:
        np.testing.assert_array_equal(a["point_data"][name], b["point_data"][name], err_msg=name)
    np.testing.assert_array_equal(a["sources"], b["sources"])


@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("look", [("superquadric", "direction"), ("ellipsoid", "fa")])
def test_stepping_through_the_volume_gives_what_all_three_planes_at_once_give(rng, step, look, monkeypatch):
    monkeypatch.setattr(glyph_planes, "_planes", glyph_planes.PlaneCache(glyph_planes.CACHED_PLANES))
    data = tensor_volume(rng)
    reference = np.diag([1.25, 1.25, 1.25, 1.0])
    reference[:3, 3] = (-10.0, 4.0, 2.5)
    cursor = np.array([11, 9, 8])
    # cursors on and off each axis's step grid, stepped one axis at a time, and the edges
    for axis, delta in [(2, 1), (2, 1), (1, -1), (0, 1), (1, 1), (2, -1), (0, -1), (0, -1)]:
        cursor[axis] += delta
        assert_same(by_planes(data, reference, reference, cursor, step, look),
                    all_at_once(data, reference, reference, cursor, step, look))  # fmt: skip
    for edge in ([0, 0, 0], [s - 1 for s in SHAPE]):
        assert_same(by_planes(data, reference, reference, edge, step, look),
                    all_at_once(data, reference, reference, edge, step, look))  # fmt: skip


def test_a_volume_on_another_grid_and_an_empty_plane(rng, monkeypatch):
    monkeypatch.setattr(glyph_planes, "_planes", glyph_planes.PlaneCache(glyph_planes.CACHED_PLANES))
    data = tensor_volume(rng, (12, 10, 9))  # covers part of the reference grid only
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    affine[:3, 3] = (1.0, -1.0, 0.5)
    reference = np.diag([1.0, 1.0, 1.0, 1.0])
    look = ("superquadric", "direction")
    for cursor in ([5, 5, 5], [6, 5, 5], [20, 5, 5], [6, 18, 16]):
        assert_same(by_planes(data, affine, reference, cursor, 2, look),
                    all_at_once(data, affine, reference, cursor, 2, look))  # fmt: skip
    empty = np.zeros_like(data)
    assert cursor_plane_tensors(empty, affine, reference, SHAPE, [5, 5, 5], 2, look) is None


def test_a_step_computes_the_moved_plane_only_and_new_data_is_not_read_from_the_cache(rng, monkeypatch):
    monkeypatch.setattr(glyph_planes, "_planes", glyph_planes.PlaneCache(glyph_planes.CACHED_PLANES))
    computed = []
    parts = glyph_planes.instance_parts
    monkeypatch.setattr(glyph_planes, "instance_parts", lambda t, **k: computed.append(len(t)) or parts(t, **k))
    data = tensor_volume(rng)
    reference = np.eye(4)
    look = ("superquadric", "direction")
    cursor_plane_tensors(data, reference, reference, SHAPE, [11, 9, 8], 2, look)
    assert len(computed) == 3
    cursor_plane_tensors(data, reference, reference, SHAPE, [11, 9, 9], 2, look)
    assert len(computed) == 4  # the z plane only
    other = data.copy()  # same shape and values, another volume: computed afresh
    other[..., 0] *= 2
    shown = by_planes(other, reference, reference, [11, 9, 9], 2, look)
    assert len(computed) == 7
    assert_same(shown, all_at_once(other, reference, reference, [11, 9, 9], 2, look))
    assert len(glyph_planes._planes) <= glyph_planes.CACHED_PLANES


def fod_volume(rng, shape=SHAPE, lmax=4):
    """Random fODF coefficients (positive l=0 term), a quarter of the voxels unfitted."""
    count = (lmax + 1) * (lmax + 2) // 2
    data = rng.normal(size=(*shape, count)).astype(np.float32) * 0.1
    data[..., 0] = 0.3
    data[rng.random(shape) < 0.25] = 0.0
    return data


@pytest.mark.parametrize("scaling", ["voxel", "global"])
@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize("each_once", [True, False])
def test_fod_glyphs_by_planes_are_the_surfaces_of_all_three_planes_at_once(rng, scaling, step, each_once, monkeypatch):
    """One mesh per plane (:func:`plane_surfaces`): the three together are the surfaces of the
    three planes' voxels at once; each voxel once (translucent glyphs), or whole planes (opaque),
    where a voxel on two planes has the same surface in both."""
    from tractlens.app.fod_display import fitted, fod_surfaces
    from tractlens.widgets.fod_glyphs import FOD_PLANES, plane_surfaces

    monkeypatch.setattr(glyph_planes, "_planes", glyph_planes.PlaneCache(glyph_planes.CACHED_PLANES))
    data = fod_volume(rng)
    reference = np.diag([1.25, 1.25, 1.25, 1.0])
    cursor = np.array([11, 9, 8])
    for axis, delta in [(2, 1), (2, 1), (1, -1), (0, 1)]:
        cursor[axis] += delta
        voxels = plane_grid_voxels(SHAPE, cursor, step)
        values, inside = sample_volume(data, reference, reference, voxels)
        keep = inside & fitted(values)
        centres = voxels[keep] @ reference[:3, :3].T + reference[:3, 3]
        points, triangles, rgb, normals = fod_surfaces(
            values[keep], centres, size_mm=1.5, scaling=scaling, subdivisions=2, normals=True
        )
        chosen = plane_choices(data, reference, reference, SHAPE, cursor, step, (2, scaling), FOD_PLANES, each_once)
        top = max(float(plane["radii"].max()) for plane, _rows, _left in chosen) if scaling == "global" else None
        meshes = [plane_surfaces(plane, rows, 2, 1.5, top) for plane, rows, _left in chosen]
        linear = np.concatenate(
            [plane["linear"] if rows is None else plane["linear"][rows] for plane, rows, _ in chosen]
        )
        vertices = len(points) // len(centres)
        for ours in meshes:  # each plane's triangles and colours: its glyphs' spheres one after the other
            count = len(ours[0]) // vertices
            np.testing.assert_array_equal(ours[1], triangles[: len(ours[1])])
            np.testing.assert_array_equal(ours[2], rgb[: len(ours[2])])
            assert len(ours[1]) == count * len(triangles) // len(centres)
        ours_points = np.concatenate([m[0] for m in meshes]).reshape(len(linear), vertices, 3)
        ours_normals = np.concatenate([m[3] for m in meshes]).reshape(len(linear), vertices, 3)
        if each_once:
            assert len(np.unique(linear)) == len(linear)
        else:  # whole planes: the voxels on two planes twice, with the same surface
            assert len(linear) == sum(len(plane["linear"]) for plane, _rows, _left in chosen)
        first = np.unique(linear, return_index=True)[1]
        for index in range(len(linear)):
            np.testing.assert_array_equal(
                ours_points[index], ours_points[first[np.searchsorted(linear[first], linear[index])]]
            )
        order = first  # np.unique sorts: the voxels in the all-at-once order
        np.testing.assert_allclose(ours_points[order].reshape(-1, 3), points, atol=1e-5)
        # normals: the same but where a vertex's faces have all but collapsed (its normal is then
        # ill-defined, and the amplitudes' last bits differ with the size of the matrix product)
        apart = np.abs(ours_normals[order].reshape(-1, 3) - normals).max(axis=1) > 1e-4
        assert apart.mean() < 1e-3, apart.mean()


def test_a_step_builds_the_moved_plane_alone(rng, monkeypatch):
    """fODF glyphs (opaque: whole planes): a step along any axis builds one plane's surfaces, and
    the other two come back as the same arrays under the same keys (the view makes and uploads
    nothing of them); translucent glyphs (each voxel once) rebuild the planes whose lines moved
    too."""
    from types import SimpleNamespace

    from tractlens.widgets import fod_glyphs

    monkeypatch.setattr(glyph_planes, "_planes", glyph_planes.PlaneCache(glyph_planes.CACHED_PLANES))
    monkeypatch.setattr(fod_glyphs, "_surfaces", glyph_planes.PlaneCache(fod_glyphs.CACHED_SURFACES))
    made = []
    surfaces = fod_glyphs.plane_surfaces
    monkeypatch.setattr(fod_glyphs, "plane_surfaces", lambda *a: made.append(len(a[0]["linear"])) or surfaces(*a))
    volume = SimpleNamespace(data=fod_volume(rng), affine=np.diag([1.25, 1.25, 1.25, 1.0]))
    layer = SimpleNamespace(data=volume, glyph_step=1, glyph_size=1.0, fod_scaling="voxel", opacity=1.0)
    doc = SimpleNamespace(reference_affine=volume.affine, reference_shape=SHAPE, cursor=np.array([11, 9, 8]))

    def build():
        return fod_glyphs.fod_glyph_job(layer, doc)[0]()

    before = build()
    assert isinstance(before, fod_glyphs.PlaneMeshes) and len(made) == 3
    for axis in (2, 1, 0):
        doc.cursor = doc.cursor + np.eye(3, dtype=int)[axis]
        after = build()
        assert len(made) == 4 + (2 - axis)  # the moved plane's surfaces alone
        for normal in range(3):
            same = after[normal][0] == before[normal][0] and after[normal][1] is before[normal][1]
            assert same == (normal != axis), (axis, normal)
        before = after
    layer.opacity = 0.5  # each voxel once: the lines across the moved plane move in the others
    build()
    made.clear()
    doc.cursor = doc.cursor + np.array([1, 0, 0])
    build()
    assert len(made) == 3  # the x plane, and the y and z planes whose lines along x moved


@pytest.mark.parametrize("ratio", [1.0, 2.0])
@pytest.mark.parametrize("size", [1.0, 2.5])
def test_fod_section_pictures_cover_what_qt_fills_with_their_triangles(qapp, rng, size, ratio):
    """The sections drawn with NumPy on a worker (:mod:`widgets.section_raster`) cover the pixels
    Qt fills with a triangle per piece (the centre and two neighbouring section points) and
    give them the piece's colour: on a slice placed off the pixel grid, partly off screen,
    at two device pixel ratios, and with glyphs larger than their cells (overlapping)."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QColor, QImage, QPainter

    from tractlens.gpu.sh import sh_basis
    from tractlens.widgets.fod_glyphs import fod_sections, section_picture
    from tractlens.widgets.glyphs import polygons_path

    step, plane = 6, (72, 72)
    grid_rows, grid_cols = np.meshgrid(np.arange(12) * step + 3, np.arange(12) * step + 3, indexing="ij")
    keep = rng.random(grid_rows.shape) < 0.8
    directions = rng.normal(size=(int(keep.sum()), 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    sh = sh_basis(np, directions, 8) * 0.2 + sh_basis(np, np.roll(directions, 1, axis=1), 8) * 0.1
    sh[:, 0] = 0.3
    pixel_mm = np.array([1.25, 1.25])
    info = (pixel_mm, (0, 1), (1, 1), 0.5 * step * 1.25)
    # 3 px a plane pixel, panned up and left, the widget 200 x 180: no glyph centre on a pixel's
    # (whose pixels on a diagonal would lie on the line between two pieces)
    target, area = (-3.3, -2.6, 216.0, 216.0), (0.0, 0.0, 200.0, 180.0)
    picture = section_picture(
        sh, grid_rows, grid_cols, keep, info, (size, 1.0, "voxel"), (target, area, ratio), plane, step
    )
    height, width = picture.pixels.shape
    assert (height, width) == (int(180 * ratio), int(200 * ratio))
    assert picture.placed(target) == pytest.approx((3.3, 2.6, 200.0, 180.0))  # from the target's corner
    off_screen = (target, (0.0, 0.0, 0.0, 0.0), ratio)  # panned away: Qt's empty intersection
    assert section_picture(sh, grid_rows, grid_cols, keep, info, (size, 1.0, "voxel"), off_screen, plane, step) == []

    # Qt's fill of a triangle per piece (no antialiasing: a pixel is in when its centre is)
    radii, world = fod_sections(sh, (0, 1), (1, 1), scaling="voxel", vertices=32)
    t = np.linspace(0.0, 2.0 * np.pi, 32, endpoint=False)
    per_px = 3.0 * ratio
    centre = np.stack([(target[0] - area[0]) * ratio + (grid_cols[keep] + 0.5) * per_px,
                       (target[1] - area[1]) * ratio + (grid_rows[keep] + 0.5) * per_px], -1)  # fmt: skip
    reach = radii * (info[3] * size * per_px / 1.25)
    ring = centre[:, None, :] + reach[:, :, None] * np.stack([np.cos(t), -np.sin(t)], -1)[None]
    middle = np.abs(world + np.roll(world, -1, axis=0))
    colours = middle / middle.max(axis=1, keepdims=True)
    image = QImage(width, height, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setPen(Qt.PenStyle.NoPen)
    for piece in range(32):
        triangles = np.stack([centre, ring[:, piece], ring[:, (piece + 1) % 32]], axis=1)
        painter.fillPath(polygons_path(triangles), QColor(*(round(255 * v) for v in colours[piece]), 255))
    painter.end()
    qt = np.frombuffer(image.constBits(), np.uint32).reshape(height, image.bytesPerLine() // 4)[:, :width]

    def channels(pixels):  # A, R, G, B
        return np.stack([(pixels >> shift) & 255 for shift in (24, 16, 8, 0)], -1).astype(int)

    ours, theirs = channels(picture.pixels), channels(qt)
    drawn = theirs[..., 0] > 0
    assert drawn.mean() > 0.02  # something drawn
    # the same pixels but for edges: where the picture covers a pixel mostly, Qt filled it (its
    # centre is in), and where it covers a pixel little, Qt did not
    assert ((ours[..., 0] > 190) & ~drawn).sum() + ((ours[..., 0] < 64) & drawn).sum() < 0.01 * drawn.sum()
    # the colours of opaque pixels away from the glyphs' centres (where all pieces meet, a
    # pixel may take any of them); where glyphs overlap, Qt shows the one filled last and the
    # picture the one covering most
    rows, cols = np.indices((height, width)) + 0.5
    near = np.zeros((height, width), bool)
    for x, y in centre:
        near |= (cols - x) ** 2 + (rows - y) ** 2 < (2.0 * ratio) ** 2
    both = (ours[..., 0] == 255) & drawn & ~near
    assert both.sum() > 0.3 * drawn.sum()
    wrong = (np.abs(ours[both, 1:] - theirs[both, 1:]).max(axis=-1) > 40).mean()  # opaque: not premultiplied
    assert wrong < (0.005 if size == 1.0 else 0.05), wrong


def test_the_plane_cache_lets_a_volume_go_with_its_entries():
    """What was made for a volume's planes goes when the volume does (a layer removed), and a
    volume that replaced it at the same key is never answered with the old one's."""
    import gc

    cache = glyph_planes.PlaneCache(8)
    old, other = np.zeros(4), np.ones(4)
    assert cache.get(("plane", 0), old, lambda: "old") == "old"
    assert cache.get(("plane", 1), old, lambda: "old 1") == "old 1"
    assert cache.get(("plane", 0), other, lambda: "other") == "other"  # same key, another volume
    assert cache.get(("plane", 0), other, lambda: "made again") == "other"
    assert len(cache) == 2
    del old
    gc.collect()
    assert len(cache) == 1 and cache.get(("plane", 0), other, lambda: "made again") == "other"


def test_fod_glyphs_of_an_empty_plane_and_an_empty_volume(rng, monkeypatch):
    """A plane without fitted voxels has no surfaces (its actor goes); a volume without any has
    no glyphs at all."""
    from types import SimpleNamespace

    from tractlens.widgets import fod_glyphs

    monkeypatch.setattr(glyph_planes, "_planes", glyph_planes.PlaneCache(glyph_planes.CACHED_PLANES))
    monkeypatch.setattr(fod_glyphs, "_surfaces", glyph_planes.PlaneCache(fod_glyphs.CACHED_SURFACES))
    data = fod_volume(rng)
    data[:, :, 8] = 0.0  # the axial plane through the cursor: nothing fitted
    volume = SimpleNamespace(data=data, affine=np.diag([1.25, 1.25, 1.25, 1.0]))
    layer = SimpleNamespace(data=volume, glyph_step=1, glyph_size=1.0, fod_scaling="global", opacity=1.0)
    doc = SimpleNamespace(reference_affine=volume.affine, reference_shape=SHAPE, cursor=np.array([11, 9, 8]))
    built = fod_glyphs.fod_glyph_job(layer, doc)[0]()
    assert built[2] == (None, None) and built[0][1] is not None and built[1][1] is not None
    volume.data = np.zeros_like(data)
    assert fod_glyphs.fod_glyph_job(layer, doc)[0]() is None
