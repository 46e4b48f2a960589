"""Sessions: save the whole document and reopen it exactly (app.session)."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.loaders import load_layers
from tractlens.app.model import Document, Layer, RoiMask
from tractlens.app.pipelines.connectivity import compute_lesion_distance, with_distances
from tractlens.app.session import load_session, save_session


@pytest.fixture(scope="module")
def demo_document(demo_dir):
    doc = Document()
    for name in ("dwi.nii.gz", "bundles.trk", "parcellation.nii.gz", "lesion.nii.gz"):
        for layer in load_layers(demo_dir / name, device="cpu"):
            doc.add_layer(layer)
    roi = RoiMask("seed", np.zeros(doc.reference_shape, bool), doc.reference_affine, role="exclusion")
    roi.apply_shape({"kind": "sphere", "centre": (20.0, 28.0, 15.0), "radius": 3.0})
    doc.add_layer(Layer("seed", roi, "roi"))
    bundles = doc.layer("bundles")
    lesion = doc.layer("lesion").data
    distance = compute_lesion_distance(bundles.data, lesion.data != 0, lesion.affine, device="cpu")
    bundles.data = with_distances(bundles.data, distance)
    bundles.set(color_by="lesion_dist_mm", colormap="hot", clim=(0.0, 10.0), opacity=0.7, tubes=True)
    bundles.set_selection(np.arange(len(bundles.data)) % 2 == 0)
    bundles.provenance = {"computed": "test", "margin_mm": 5.0}
    doc.layer("FA").set(clim=(0.1, 0.9), colormap="viridis", visible=False)
    doc.set_cursor((10, 11, 12))
    return doc


def _same_layer(a: Layer, b: Layer) -> None:
    assert (a.name, a.kind) == (b.name, b.kind)
    for key in Layer._DISPLAY:
        assert getattr(a, key) == getattr(b, key), key
    assert a.provenance == b.provenance
    if a.kind == "tractogram":
        np.testing.assert_array_equal(a.data.points, b.data.points)  # bit for bit
        np.testing.assert_array_equal(a.data.offsets, b.data.offsets)
        np.testing.assert_array_equal(a.data.affine, b.data.affine)
        assert a.data.point_scalars.keys() == b.data.point_scalars.keys()
        for key, values in a.data.point_scalars.items():
            np.testing.assert_array_equal(values, b.data.point_scalars[key])
        for key, values in a.data.streamline_scalars.items():
            np.testing.assert_array_equal(values, b.data.streamline_scalars[key])
        np.testing.assert_array_equal(a.selection, b.selection)
    elif a.kind == "roi":
        np.testing.assert_array_equal(a.data.mask, b.data.mask)
        np.testing.assert_array_equal(a.data.affine, b.data.affine)
        assert a.data.role == b.data.role
        assert a.data.shape["kind"] == b.data.shape["kind"]
        np.testing.assert_array_equal(a.data.shape["centre"], b.data.shape["centre"])
    else:
        np.testing.assert_array_equal(a.data.data, b.data.data)
        assert a.data.data.dtype == b.data.data.dtype
        np.testing.assert_array_equal(a.data.affine, b.data.affine)
        assert a.data.kind == b.data.kind
        if a.kind == "dwi":
            np.testing.assert_array_equal(a.data.dwi.data, b.data.dwi.data)
            np.testing.assert_array_equal(a.data.dwi.bvals, b.data.dwi.bvals)
            np.testing.assert_array_equal(a.data.dwi.bvecs, b.data.dwi.bvecs)
        if a.data.lut is not None:
            assert a.data.lut.names == b.data.lut.names and a.data.lut.colours == b.data.lut.colours


def test_session_round_trip_is_exact(demo_document, tmp_path):
    path = save_session(demo_document, tmp_path / "case", panels={"presurgical": {"margin_mm": 5.0}})
    assert path.name == "case.tractlens"
    session = load_session(path)
    doc = session.document
    assert [layer.name for layer in doc.layers] == [layer.name for layer in demo_document.layers]
    for a, b in zip(demo_document.layers, doc.layers):
        _same_layer(a, b)
    np.testing.assert_array_equal(doc.reference_affine, demo_document.reference_affine)
    assert doc.reference_shape == demo_document.reference_shape
    np.testing.assert_array_equal(doc.cursor, [10, 11, 12])
    assert session.panels == {"presurgical": {"margin_mm": 5.0}}
    assert doc.layer("parcellation").data.lut.name(3) == "crossing_ap_start"
    assert not list(tmp_path.glob(".*tmp*"))  # nothing half-written left beside it


def _with_manifest(path, out, edit) -> None:
    """Copy the session ``path`` to ``out`` with ``edit(manifest)`` applied to its manifest."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "manifest.json":
                manifest = json.loads(data)
                edit(manifest)
                data = json.dumps(manifest).encode()
            dst.writestr(item, data)


def test_damaged_and_foreign_sessions_give_clear_errors(demo_document, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_session(tmp_path / "missing.tractlens")
    text = tmp_path / "notes.tractlens"
    text.write_text("hello")
    with pytest.raises(InputError, match="not a TractLens session"):
        load_session(text)
    path = save_session(demo_document, tmp_path / "case.tractlens")
    newer = tmp_path / "newer.tractlens"
    _with_manifest(path, newer, lambda manifest: manifest.update(version=99))
    with pytest.raises(InputError, match="newer TractLens"):
        load_session(newer)
    truncated = tmp_path / "truncated.tractlens"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(InputError):
        load_session(truncated)
    odd = tmp_path / "odd.tractlens"  # a manifest whose panel settings are a number (found by fuzzing)
    _with_manifest(path, odd, lambda manifest: manifest.update(panels=1.5))
    with pytest.raises(InputError, match="panel settings"):
        load_session(odd)


def test_a_version_1_session_is_migrated_when_read(demo_document, tmp_path):
    """Sessions written by the first release (format 1: no layer ids, no view settings) open."""
    path = save_session(demo_document, tmp_path / "new.tractlens")
    old = tmp_path / "old.tractlens"

    def as_version_1(manifest):
        manifest["version"] = 1
        for entry in manifest["layers"]:
            del entry["uid"]
        manifest["panels"].pop("view", None)

    _with_manifest(path, old, as_version_1)
    session = load_session(old)
    assert session.manifest["version"] == 2
    assert [entry["uid"] for entry in session.manifest["layers"]] == [f"L{i}" for i in range(len(demo_document.layers))]
    assert session.panels["view"] == {}
    for a, b in zip(demo_document.layers, session.document.layers):
        _same_layer(a, b)


def test_session_folder_round_trip_rewrites_only_what_changed(demo_document, tmp_path):
    """The autosave's store: a folder session, exact, incremental, and readable at every moment."""
    from tractlens.app.session import SessionFolder, snapshot

    folder = SessionFolder(tmp_path / "store")
    assert folder.write(snapshot(demo_document))
    reopened = load_session(tmp_path / "store").document
    for a, b in zip(demo_document.layers, reopened.layers):
        _same_layer(a, b)
    files = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "store" / "layers").iterdir()}
    assert not folder.write(snapshot(demo_document))  # nothing changed: nothing written
    roi = demo_document.layer("seed")
    before = roi.data.mask.copy()
    try:
        demo_document.paint(roi, np.array([[1, 1, 1]]), True)
        assert folder.write(snapshot(demo_document))
        after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "store" / "layers").iterdir()}
        new = set(after) - set(files)
        gone = set(files) - set(after)
        assert len(new) == 1 and "_mask_" in next(iter(new)) and len(gone) == 1 and "_mask_" in next(iter(gone))
        assert all(after[name] == files[name] for name in after if name in files)  # untouched
        np.testing.assert_array_equal(load_session(tmp_path / "store").document.layer("seed").data.mask, roi.data.mask)
    finally:
        roi.data.mask[...] = before


def test_a_write_interrupted_midway_leaves_the_previous_autosave_readable(demo_document, tmp_path, monkeypatch):
    """A crash while side files are written: the manifest on disk still names complete files."""
    import tractlens.app.session as session_module
    from tractlens.app.session import SessionFolder, snapshot

    folder = SessionFolder(tmp_path / "store")
    folder.write(snapshot(demo_document))
    manifest_before = (tmp_path / "store" / "manifest.json").read_bytes()
    roi = demo_document.layer("seed")
    before = roi.data.mask.copy()

    def crash(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(session_module, "save_volume", crash)
    try:
        demo_document.paint(roi, np.array([[2, 2, 2]]), True)
        with pytest.raises(OSError):
            folder.write(snapshot(demo_document))
    finally:
        roi.data.mask[...] = before
    assert (tmp_path / "store" / "manifest.json").read_bytes() == manifest_before
    restored = load_session(tmp_path / "store").document
    np.testing.assert_array_equal(restored.layer("seed").data.mask, before)


def test_side_file_names_cannot_leave_the_session(tmp_path, demo_document):
    """A hand-made manifest naming ../ files is refused, not followed."""
    from tractlens.app.session import SessionFolder, snapshot

    SessionFolder(tmp_path / "store").write(snapshot(demo_document))
    manifest_path = tmp_path / "store" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["layers"][0]["files"]["data"] = "../../outside.nii.gz"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="damaged"):
        load_session(tmp_path / "store")


@pytest.mark.parametrize("suffix", ["file", "folder"])
def test_integer_and_boolean_layers_round_trip_with_their_dtype(tmp_path, suffix):
    """Issue 22, defect 1: a "probabilistic paths" layer (int64 counts) made Save session and
    every autosave fail. Each integer/bool dtype must be written and come back equal, same dtype."""
    from tractlens.app.model import Volume
    from tractlens.app.session import SessionFolder, snapshot

    shape, affine = (6, 5, 4), np.diag([2.0, 2.0, 2.5, 1.0])
    rng = np.random.default_rng(22)
    arrays = {
        "probabilistic paths": rng.integers(0, 5000, shape).astype(np.int64),
        "big counts": np.full(shape, 2**40, np.int64),  # beyond int32: still exact
        "uint64": rng.integers(0, 2**62, shape, dtype=np.uint64),
        "bool": rng.random(shape) > 0.5,
        "uint8": rng.integers(0, 255, shape).astype(np.uint8),
        "int16": rng.integers(-3000, 3000, shape).astype(np.int16),
        "float16": rng.random(shape).astype(np.float16),
    }
    doc = Document()
    for name, array in arrays.items():
        doc.add_layer(Layer(name, Volume(name, array, affine, kind="scalar"), "scalar"))
    if suffix == "file":
        path = save_session(doc, tmp_path / "ints")
    else:
        path = tmp_path / "autosave"
        assert SessionFolder(path).write(snapshot(doc))
    reopened = load_session(path).document
    for name, array in arrays.items():
        back = reopened.layer(name).data.data
        assert back.dtype == array.dtype, name
        np.testing.assert_array_equal(back, array, err_msg=name)


def test_a_selection_comes_back_with_what_made_it(demo_document, tmp_path):
    layer = next(layer for layer in demo_document.layers if layer.kind == "tractogram")
    keep = np.zeros(len(layer.data), dtype=bool)
    keep[::3] = True
    layer.set_selection(keep, by="ROIs seed, target")
    doc = load_session(save_session(demo_document, tmp_path / "selected")).document
    back = doc.layer(layer.name)
    np.testing.assert_array_equal(back.selection, keep)
    assert back.selection_by == "ROIs seed, target"  # not "a selection" after reopening
