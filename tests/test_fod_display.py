"""fODF glyph geometry (SH surfaces and sections), fODF layers from files and sessions, and the
door to fODF tracking."""

from __future__ import annotations

import numpy as np
import pytest

from tests.csd_synth import gradient_table, voxel_signal
from tractlens.app import fod_layers
from tractlens.app.fod_display import (
    direction_colours,
    fod_amplitudes,
    fod_sections,
    fod_surfaces,
    glyph_radii,
    icosphere,
    sphere_level,
    surface_normals,
)
from tractlens.app.fod_layers import csd_result_layers, fod_layer, is_fod_path, track_on_fod
from tractlens.app.io import DWI
from tractlens.app.io.fod import save_fod
from tractlens.app.loaders import load_layers, needs_gradient_files
from tractlens.app.model import Document
from tractlens.app.pipelines.csd import fit_csd_pipeline, write_csd_outputs
from tractlens.app.session import load_session, save_session
from tractlens.gpu.sh import fibonacci_hemisphere, sh_basis

X, Y = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
PHANTOM_SHAPE = (8, 8, 3)


def phantom_dwi() -> DWI:
    """A small single-shell phantom on a 2 mm grid (voxel axes = world axes): a bundle along x
    (i < 3), a 90° crossing of x and y (i = 3, 4), a bundle along y (i > 4)."""
    bvals, bvecs = gradient_table((1000.0,), directions=45, b0=2)
    data = np.zeros((*PHANTOM_SHAPE, len(bvals)), np.float32)
    for i in range(PHANTOM_SHAPE[0]):
        fibres = [X] if i < 3 else [X, Y] if i < 5 else [Y]
        data[i] = voxel_signal(bvals, bvecs, np.array(fibres))
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    affine[:3, 3] = [-7.0, -7.0, -2.0]
    return DWI(data, affine, bvals, bvecs, path="phantom.nii.gz")


def fit_csd_folder(folder, lmax: int = 8):
    """``fit-csd`` outputs of :func:`phantom_dwi` in ``folder`` (the files, and the result)."""
    from tractlens.gpu.csd import CSDParams

    result = fit_csd_pipeline(
        phantom_dwi(), mask=np.ones(PHANTOM_SHAPE, bool), params=CSDParams(lmax=lmax), device="cpu"
    )
    write_csd_outputs(result, folder)
    return result


def coefficients_of(function, lmax: int = 8) -> np.ndarray:
    """SH coefficients (MRtrix basis) of an antipodally symmetric function, by least squares on
    many directions (exact for a polynomial of degree ≤ lmax)."""
    directions = fibonacci_hemisphere(600)
    basis = sh_basis(np, directions, lmax)
    return np.linalg.lstsq(basis, function(directions), rcond=None)[0]


def lobe(axis, power: int = 8):
    return lambda u: (u @ axis) ** power


def test_amplitudes_on_the_sphere_mesh_are_the_function_the_coefficients_hold():
    axis = np.array([1.0, 2.0, 0.5]) / np.linalg.norm([1.0, 2.0, 0.5])
    sh = coefficients_of(lobe(axis, 4), lmax=4)
    vertices, _faces = icosphere(2)
    amplitudes = fod_amplitudes(sh[None], vertices)
    np.testing.assert_allclose(amplitudes[0], (vertices @ axis) ** 4, atol=1e-9)
    # and the same as gpu.sh's basis at those directions, for a random lmax-8 series
    rng = np.random.default_rng(1)
    random = rng.normal(size=(3, 45))
    np.testing.assert_allclose(fod_amplitudes(random, vertices), random @ sh_basis(np, vertices, 8).T, rtol=1e-12)


def test_icosphere_is_closed_unit_and_faces_outwards():
    for level, count in ((1, 42), (2, 162), (3, 642)):
        vertices, faces = icosphere(level)
        assert len(vertices) == count and len(faces) == 20 * 4**level
        np.testing.assert_allclose(np.linalg.norm(vertices, axis=1), 1.0, atol=1e-12)
        corners = vertices[faces]
        normals = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
        assert np.all(np.einsum("ij,ij->i", normals, corners.mean(axis=1)) > 0)
    assert sphere_level(100, 1_500_000) == 3 and sphere_level(2000, 1_500_000) == 2
    assert sphere_level(2000, 60_000) == 1


def test_a_crossing_glyph_reaches_furthest_along_its_two_fibres():
    sh = coefficients_of(lambda u: lobe(X)(u) + 0.6 * lobe(Y)(u))
    centre = np.array([[10.0, -4.0, 3.0]])
    points, triangles, rgb = fod_surfaces(sh[None], centre, size_mm=2.0, scaling="global", subdivisions=3)
    offsets = points - centre
    radius = np.linalg.norm(offsets, axis=1)
    tip = offsets[np.argmax(radius)] / radius.max()
    assert abs(tip @ X) > np.cos(np.radians(5.0))  # the larger lobe, within the mesh's spacing
    assert radius.max() == pytest.approx(2.0, rel=1e-9)  # global: the largest amplitude is size_mm
    along_y = offsets[np.abs(offsets @ Y) > 0.99 * radius]
    assert np.linalg.norm(along_y, axis=1).max() == pytest.approx(1.2, rel=0.05)  # 0.6 of the x lobe
    assert triangles.max() == len(points) - 1
    vertices, _ = icosphere(3)
    red = np.argmax(np.abs(vertices @ X))
    assert rgb[red][0] == 255 and rgb[red][1:].max() < 40  # red along x


@pytest.mark.parametrize("scaling", ["voxel", "global"])
def test_glyph_normals_are_the_surfaces_exact_normals(scaling):
    """The vertex normals from the amplitudes' gradient: a sphere's are its directions, whatever
    its size; a collapsed glyph's too; on crossing fODFs they are what VTK's normals filter finds
    on a fine mesh of the same surfaces (which averages its faces' normals: it tends to the
    exact normal as the faces shrink)."""
    import pyvista as pv

    directions, _faces = icosphere(2)
    iso = np.zeros((2, 15))
    iso[:, 0] = [0.3, 1.0]
    amplitudes = fod_amplitudes(iso, directions)
    spheres = surface_normals(iso, amplitudes, glyph_radii(amplitudes, scaling), 2)
    np.testing.assert_allclose(spheres, np.tile(directions, (2, 1)), atol=1e-5)
    zero = np.zeros((1, 15))
    collapsed = surface_normals(zero, np.zeros((1, len(directions))), np.zeros((1, len(directions))), 2)
    np.testing.assert_allclose(collapsed, directions, atol=1e-6)
    sh = np.stack([coefficients_of(lambda u, w=w: lobe(X)(u) + w * lobe(Y)(u)) for w in (0.2, 0.6, 1.0)])
    centres = np.array([[0.0, 0.0, 0.0], [5.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
    points, triangles, _rgb, normals = fod_surfaces(
        sh, centres, size_mm=2.0, scaling=scaling, subdivisions=5, normals=True
    )
    np.testing.assert_allclose(np.linalg.norm(normals, axis=1), 1.0, atol=1e-5)
    mesh = pv.PolyData.from_regular_faces(points, triangles)
    reference = mesh.compute_normals(cell_normals=False, split_vertices=False, consistent_normals=False)
    agree = np.sum(normals * reference.point_data["Normals"], axis=1)
    assert np.median(agree) > 0.9999 and np.percentile(agree, 2) > 0.99, (np.median(agree), np.percentile(agree, 2))
    # All amplitudes positive (min-max per voxel then subtracts each glyph's least), and at a
    # millionth of the scale: the same normals.
    positive = sh.copy()
    positive[:, 0] += 3.0 * np.abs(fod_amplitudes(sh, icosphere(5)[0])).max() / 0.2820948
    for scale in (1.0, 1e-6):
        points, triangles, _rgb, normals = fod_surfaces(
            positive * scale, centres, size_mm=2.0, scaling=scaling, subdivisions=5, normals=True
        )
        assert fod_amplitudes(positive * scale, icosphere(5)[0]).min() > 0
        mesh = pv.PolyData.from_regular_faces(points, triangles)
        reference = mesh.compute_normals(cell_normals=False, split_vertices=False, consistent_normals=False)
        agree = np.sum(normals * reference.point_data["Normals"], axis=1)
        assert np.median(agree) > 0.9999 and np.percentile(agree, 2) > 0.99, (scale, np.percentile(agree, 2))


def test_scalings_voxel_min_max_and_global_relative():
    sh = coefficients_of(lobe(X))
    half = 0.5 * sh
    vertices, _ = icosphere(2)
    amplitudes = fod_amplitudes(np.stack([sh, half]), vertices)
    voxel = glyph_radii(amplitudes, "voxel")
    np.testing.assert_allclose(voxel.max(axis=1), 1.0)
    np.testing.assert_allclose(voxel.min(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(voxel[0], voxel[1], atol=1e-12)  # min-max hides the scale
    relative = glyph_radii(amplitudes, "global")
    assert relative.max() == pytest.approx(1.0)
    np.testing.assert_allclose(relative[1], 0.5 * relative[0], atol=1e-12)
    ringing = glyph_radii(np.array([[-0.2, 0.0, 1.0]]), "global")
    np.testing.assert_array_equal(ringing, [[0.0, 0.0, 1.0]])  # negative lobes are drawn as zero
    with pytest.raises(ValueError, match="voxel, global"):
        glyph_radii(amplitudes, "per-voxel")


def test_a_section_in_the_slice_plane_follows_the_fibre():
    sh = coefficients_of(lobe(np.array([1.0, 1.0, 0.0]) / np.sqrt(2)))
    # axial view, screen right = world +x, screen up = world +y: the fibre at 45° on the screen
    radii, world = fod_sections(sh[None], (0, 1), (1, 1), vertices=32)
    assert np.argmax(radii[0]) in (4, 20)  # t = 45° or 225°
    np.testing.assert_allclose(world[4], [np.sqrt(0.5), np.sqrt(0.5), 0.0], atol=1e-12)
    # a fibre through the plane leaves a small section when scaled over the whole sphere
    through = coefficients_of(lobe(np.array([0.0, 0.0, 1.0])))
    radii, _ = fod_sections(through[None], (0, 1), (1, 1))
    assert radii.max() < 0.05


def test_direction_colours_are_bright_along_each_axis():
    np.testing.assert_array_equal(direction_colours(np.eye(3)), 255 * np.eye(3, dtype=np.uint8))


def test_a_fit_csd_folder_opens_as_fod_peaks_and_background(tmp_path):
    result = fit_csd_folder(tmp_path / "csd")
    layers = load_layers(tmp_path / "csd")
    kinds = {layer.name: layer.kind for layer in layers}
    assert kinds == {"csd fODF l=0": "scalar", "csd peaks": "dyads", "csd fODF": "fod"}
    fod = layers[-1]
    np.testing.assert_allclose(fod.data.data, result.fod(), atol=1e-6)
    peaks = layers[1].data.data  # voxel axes, largest first: the x bundle's first stick along x
    assert abs(peaks[1, 4, 1, 0, 0]) > 0.95 and peaks[1, 4, 1, 0, 3] > 0
    assert is_fod_path(tmp_path / "csd" / "fod.nii.gz")
    assert not needs_gradient_files(tmp_path / "csd" / "fod.nii.gz")  # SH volumes, not a DWI series
    image_layers = load_layers(tmp_path / "csd" / "fod.nii.gz")
    assert [layer.kind for layer in image_layers] == ["scalar", "fod"]


def test_an_unlabelled_fod_image_names_the_missing_basis(tmp_path):
    import nibabel as nib

    path = tmp_path / "wmfod.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4, 45), np.float32), np.eye(4)), path)
    assert is_fod_path(path)
    with pytest.raises(Exception, match="basis"):
        load_layers(path)


def test_a_session_keeps_an_fod_file_as_its_path_and_a_computed_fod_as_data(tmp_path):
    rng = np.random.default_rng(0)
    sh = rng.normal(size=(5, 4, 3, 15)).astype(np.float32)
    sh[..., 0] = np.abs(sh[..., 0]) + 1
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    save_fod(sh, affine, tmp_path / "fod.nii.gz")
    doc = Document()
    for layer in load_layers(tmp_path / "fod.nii.gz"):
        doc.add_layer(layer)
    computed = fod_layer("computed fODF", 2 * sh, affine)
    doc.add_layer(computed)
    doc.layers[1].set(fod_scaling="global")
    saved = save_session(doc, tmp_path / "s.tractlens")
    import json
    import zipfile

    with zipfile.ZipFile(saved) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    entries = {entry["name"]: entry for entry in manifest["layers"]}
    assert entries["fODF"]["fod"]["path"] == str((tmp_path / "fod.nii.gz").resolve())
    assert "data" not in entries["fODF"]["files"]  # not written again
    assert "data" in entries["computed fODF"]["files"]
    restored = {layer.name: layer for layer in load_session(saved).document.layers}
    assert restored["fODF"].kind == "fod" and restored["fODF"].fod_scaling == "global"
    np.testing.assert_allclose(restored["fODF"].data.data, sh, atol=1e-6)
    np.testing.assert_allclose(restored["computed fODF"].data.data, 2 * sh, atol=1e-6)


def test_the_tracking_door_passes_what_the_tracker_takes(tmp_path, monkeypatch):
    calls = []

    def track_fod_deterministic(fod, regions, *, whole_brain=False, params=None, progress=None, **options):
        calls.append((fod, regions, whole_brain, params, progress))
        return "result"

    monkeypatch.setattr(fod_layers, "track_fod_deterministic", track_fod_deterministic)  # the tracker it calls
    layer = fod_layer("f", np.ones((2, 2, 2, 6), np.float32), np.eye(4))
    out = track_on_fod(layer.data, "regions", whole_brain=True, params="p", cancelled=None, on_batch=None)
    assert out == "result"
    fod, regions, whole, params, progress = calls[0]
    assert isinstance(fod, tuple) and fod[0].shape == (2, 2, 2, 6)  # no file: the coefficients
    assert (regions, whole, params, progress) == ("regions", True, "p", None)


def test_the_value_under_the_cursor_is_the_mean_amplitude():
    sh = np.zeros((2, 2, 2, 15), np.float32)
    sh[1, 1, 1, 0] = 2.0
    sh[1, 1, 1, 3] = 5.0  # an l=2 term: no part of the mean
    layer = fod_layer("f", sh, np.eye(4))
    vertices, _ = icosphere(3)
    mean = fod_amplitudes(sh[1, 1, 1][None], vertices).mean()
    assert layer.value_at_world(np.array([1.0, 1.0, 1.0])) == pytest.approx(mean, rel=0.02)
    assert layer.value_at_world(np.array([0.0, 0.0, 0.0])) == 0.0


def test_a_session_whose_fod_file_has_gone_says_so(tmp_path):
    sh = np.zeros((4, 4, 3, 15), np.float32)
    sh[..., 0] = 1.0
    save_fod(sh, np.eye(4), tmp_path / "fod.nii.gz")
    doc = Document()
    for layer in load_layers(tmp_path / "fod.nii.gz"):
        doc.add_layer(layer)
    saved = save_session(doc, tmp_path / "s.tractlens")
    (tmp_path / "fod.nii.gz").unlink()
    with pytest.raises(Exception, match="no longer there") as caught:
        load_session(saved)
    assert "damaged" not in str(caught.value) and "fod.nii.gz" in str(caught.value)


def test_a_multi_tissue_fit_adds_gm_and_csf_maps_under_the_fod():
    shape, affine = (3, 3, 2), np.eye(4)

    class Fit:  # what csd_result_layers reads of app.pipelines.csd.CSDResult
        class model:
            msmt = True

        def fod(self):
            return np.ones((*shape, 15), np.float32)

        def peaks(self):
            return np.zeros((*shape, 9), np.float32)

        def tissue(self, name):
            return np.full(shape, 0.3 if name == "gm" else 0.7, np.float32)

    result = Fit()
    result.affine = affine
    layers = csd_result_layers(result, "CSD")
    assert [(layer.name, layer.kind, layer.visible) for layer in layers] == [
        ("CSD GM", "scalar", False),
        ("CSD CSF", "scalar", False),
        ("CSD peaks", "dyads", False),
        ("CSD fODF", "fod", True),
    ]
    assert layers[1].data.data[0, 0, 0] == pytest.approx(0.7)


def test_a_45_volume_diffusion_series_with_its_gradients_stays_a_series(tmp_path):
    import nibabel as nib

    img = nib.Nifti1Image(np.ones((4, 4, 4, 45), np.float32), np.eye(4))
    img.header["descrip"] = b"MRtrix version: 3.0.4"
    nib.save(img, tmp_path / "fod_like.nii.gz")
    assert is_fod_path(tmp_path / "fod_like.nii.gz")  # MRtrix-written, SH count, no gradients: an fODF
    (tmp_path / "fod_like.bval").write_text(" ".join(["0"] * 5 + ["1000"] * 40) + "\n")
    (tmp_path / "fod_like.bvec").write_text("\n".join(" ".join(["1"] * 45) for _ in range(3)) + "\n")
    assert not is_fod_path(tmp_path / "fod_like.nii.gz")
