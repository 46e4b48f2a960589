import numpy as np
import pytest

from tractlens.app.model import RoiMask, Tractogram, Volume


def test_views_hear_about_changes():
    vol = Volume("fa", np.zeros((3, 3, 3)), np.eye(4))
    events = []
    vol.connect(lambda src, event, **info: events.append((src.name, event)))
    vol.data = np.ones((3, 3, 3))
    assert events == [("fa", "data")]
    with pytest.raises(ValueError, match="grid cannot change"):
        vol.data = np.ones((4, 3, 3))


def test_roi_painting_emits_and_counts():
    roi = RoiMask("seed", np.zeros((4, 4, 4)), np.eye(4), role="seed")
    seen = []
    roi.connect(lambda *a, **k: seen.append(1))
    roi.set_voxels((slice(0, 2), 1, 1))
    assert roi.voxel_count == 2 and seen == [1]
    with pytest.raises(ValueError, match="unknown ROI role"):
        RoiMask("x", np.zeros((2, 2, 2)), np.eye(4), role="maybe")


def test_tractogram_is_a_validated_ragged_array():
    t = Tractogram.from_list([np.zeros((3, 3)), np.ones((2, 3))], affine=np.diag([2, 2, 2, 1.0]))
    assert len(t) == 2 and t.lengths.tolist() == [3, 2]
    np.testing.assert_array_equal(t[1], np.ones((2, 3)))
    np.testing.assert_array_equal(t.points_world()[-1], [2, 2, 2])
    with pytest.raises(ValueError, match="end at the number of points"):
        Tractogram(np.zeros((4, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="streamline scalar 'cm' has 1 values"):
        Tractogram(np.zeros((4, 3)), np.array([0, 2, 4]), streamline_scalars={"cm": np.zeros(1)})


def test_a_volume_layer_takes_new_values_in_place_and_tells_the_views_once():
    from tractlens.app.model import Document, Layer

    doc = Document()
    layer = doc.add_layer(Layer("paths", Volume("paths", np.zeros((4, 4, 2)), np.eye(4)), "scalar"))
    events = []
    doc.connect(lambda _src, event, **info: events.append((event, info.get("layer"), info.get("changed"))))
    values = np.arange(32.0).reshape(4, 4, 2)
    layer.set_data(values, clim=(0, 31), transparent_below=1)
    assert layer.data.data is values and layer.clim == (0.0, 31.0) and layer.transparent_below == 1.0
    assert events == [("display", layer, ["data", "clim", "transparent_below"])]
    layer.set_data(values)  # the same values again: still news (a view cannot tell otherwise)
    assert events[-1] == ("display", layer, ["data"])
    with pytest.raises(ValueError, match="grid cannot change"):
        layer.set_data(np.zeros((3, 4, 2)))
    with pytest.raises(ValueError, match="unknown display property"):
        layer.set_data(values, colour="red")
    assert len(events) == 2  # refusals change nothing
    roi = Layer("seed", RoiMask("seed", np.zeros((4, 4, 2)), np.eye(4)), "roi")
    with pytest.raises(ValueError, match="no volume"):
        roi.set_data(np.ones((4, 4, 2)))


def _roi_document():
    from tractlens.app.model import Document, Layer

    doc = Document()
    doc.add_layer(
        Layer("anat", Volume("anat", np.zeros((8, 8, 6), np.float32), np.diag([2.0, 2.0, 3.0, 1.0])), "scalar")
    )
    return doc


def _state(doc):
    return [
        (layer.name, layer.color, getattr(layer.data, "role", None), getattr(layer.data, "mask", np.zeros(0)).tobytes())
        for layer in doc.layers
    ]


def test_every_roi_edit_is_undone_and_redone_exactly():
    from tractlens.app.model import Layer

    doc = _roi_document()
    roi = Layer("seed 1", RoiMask("seed 1", np.zeros((8, 8, 6)), doc.reference_affine), "roi")
    states = [_state(doc)]
    edits = [
        lambda: doc.add_layer(roi, undoable=True),
        lambda: doc.paint(roi, np.array([[1, 1, 1], [2, 2, 2]]), True),
        lambda: doc.set_roi_shape(roi, {"kind": "box", "centre": (4, 4, 3), "radius": (2, 1, 0)}),
        lambda: doc.set_roi_role(roi, "exclusion"),
        lambda: doc.rename_layer(roi, "lesion margin"),
        lambda: doc.set_layer_color(roi, (1.0, 0.5, 0.0)),
        lambda: doc.remove_layer(roi, undoable=True),
    ]
    for edit in edits:
        edit()
        states.append(_state(doc))
    assert roi.data.mask.sum() == 5 * 3 * 1 and roi.data.name == "lesion margin" and roi.color == "#ff8000"
    for expected in reversed(states[:-1]):
        assert doc.undo()
        assert _state(doc) == expected
    assert not doc.undo()
    for expected in states[1:]:
        assert doc.redo()
        assert _state(doc) == expected
    assert not doc.redo()


def test_a_layer_removed_for_good_takes_its_history_with_it():
    from tractlens.app.model import Layer

    doc = _roi_document()
    a = doc.add_layer(Layer("a", RoiMask("a", np.zeros((8, 8, 6)), doc.reference_affine), "roi"), undoable=True)
    b = doc.add_layer(Layer("b", RoiMask("b", np.zeros((8, 8, 6)), doc.reference_affine), "roi"), undoable=True)
    doc.paint(a, np.array([[1, 1, 1]]), True)
    doc.paint(b, np.array([[2, 2, 2]]), True)
    doc.remove_layer(a)  # a script, not the user's Remove: no undo brings it back
    assert doc.undo() and not b.data.mask.any()
    assert doc.undo() and b not in doc.layers
    assert not doc.undo() and a not in doc.layers
    assert doc.redo() and doc.redo() and b.data.mask[2, 2, 2]
    for layer in list(doc.layers):  # e.g. a session replacing the document: nothing to undo or redo
        doc.remove_layer(layer)
    assert not doc.undo() and not doc.redo()


def test_rename_refuses_a_name_in_use_and_colours_are_checked():
    from tractlens.app.model import Layer

    doc = _roi_document()
    roi = doc.add_layer(Layer("seed 1", RoiMask("seed 1", np.zeros((8, 8, 6)), doc.reference_affine), "roi"))
    with pytest.raises(ValueError, match="already a layer named 'anat'"):
        doc.rename_layer(roi, "anat")
    with pytest.raises(ValueError, match="needs a name"):
        doc.rename_layer(roi, "  ")
    assert not doc.rename_layer(roi, "seed 1") and not doc.undo()  # no change, no undo step
    with pytest.raises(ValueError, match="#rrggbb"):
        doc.set_layer_color(roi, "orange")
    assert roi.color_rgb() == (0.1, 0.9, 0.2)  # the seed role's colour until one is chosen
    doc.set_layer_color(roi, "#FF8000")
    assert roi.color == "#ff8000" and roi.color_rgb() == (1.0, 128 / 255, 0.0)
    doc.set_roi_role(roi, "target")
    assert roi.color_rgb() == (1.0, 128 / 255, 0.0)  # its own colour stays with another role


def test_a_box_has_a_half_size_per_axis():
    roi = RoiMask("box", np.zeros((9, 9, 9)), np.eye(4))
    roi.apply_shape({"kind": "box", "centre": (4.5, 4, 4), "radius": (1.5, 2, 0)})
    assert {tuple(v) for v in np.argwhere(roi.mask)} == {(x, y, 4) for x in range(3, 7) for y in range(2, 7)}
    assert roi.shape["radius"] == (1.5, 2.0, 0.0)
    roi.apply_shape({"kind": "box", "centre": (4, 4, 4), "radius": [1, 1, 1]})
    assert roi.shape["radius"] == 1.0 and roi.voxel_count == 27  # equal half-sizes: one number
    with pytest.raises(ValueError, match="a sphere has one radius"):
        roi.apply_shape({"kind": "sphere", "centre": (4, 4, 4), "radius": (1, 2, 3)})


def test_a_session_keeps_an_rois_name_and_colour(tmp_path):
    from tractlens.app.model import Layer
    from tractlens.app.session import load_session, save_session

    doc = _roi_document()
    roi = doc.add_layer(Layer("seed 1", RoiMask("seed 1", np.zeros((8, 8, 6)), doc.reference_affine), "roi"))
    doc.paint(roi, np.array([[1, 2, 3], [4, 5, 2]]), True)
    doc.rename_layer(roi, "motor cortex")
    doc.set_layer_color(roi, (0.2, 0.4, 0.6))
    plain = doc.add_layer(
        Layer("target 1", RoiMask("target 1", np.zeros((8, 8, 6)), doc.reference_affine, role="target"), "roi")
    )
    save_session(doc, tmp_path / "s.tractlens")
    restored = load_session(tmp_path / "s.tractlens").document
    again = restored.layer("motor cortex")
    assert again.data.name == "motor cortex" and again.color == "#336699" == roi.color
    assert again.color_rgb() == roi.color_rgb()
    np.testing.assert_array_equal(again.data.mask, roi.data.mask)
    assert restored.layer("target 1").color is None and plain.color is None  # still its role's colour
