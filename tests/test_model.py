import numpy as np
import pytest

from app.model import RoiMask, Tractogram, Volume


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
    from app.model import Document, Layer

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
