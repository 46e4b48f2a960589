"""Issue 22 defects 4 and 5 without a window: what a tractogram shows is explicit state that every
count reads, and the lesion is never chosen by a guess."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.app.model import Document, Layer, RoiMask, Tractogram, Volume
from tractlens.app.pipelines.connectivity import (
    default_lesion,
    distance_rows,
    distance_to_lesion_mm,
    lesion_choices,
    lesion_distance_map,
    lesion_mask_of,
)
from tractlens.app.selection import RoiSelection, empty_selection_notice, select_fibres, shown_of

AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


def _lines(n: int) -> Tractogram:
    """n straight streamlines along x at y = 2 + i (voxels), on a 20³ grid of 2 mm voxels."""
    return Tractogram.from_list(
        [np.column_stack([np.arange(2, 18), np.full(16, 2 + i), np.full(16, 10)]) for i in range(n)],
        affine=AFFINE,
        dimensions=(20, 20, 20),
    )


def _roi(name: str, role: str, index) -> Layer:
    mask = np.zeros((20, 20, 20), bool)
    mask[index] = True
    return Layer(name, RoiMask(name, mask, AFFINE, role=role), "roi")


def _document_with_tracts(n: int = 10):
    doc = Document()
    doc.add_layer(Layer("FA", Volume("FA", np.full((20, 20, 20), 0.5, np.float32), AFFINE), "scalar"))
    tract = doc.add_layer(Layer("tract", _lines(n), "tractogram", filter_by_rois=True))  # the user's choice
    return doc, tract


def test_a_selection_by_rois_is_named_and_counted_on_the_layer():
    doc, tract = _document_with_tracts(10)
    doc.add_layer(_roi("seed", "seed", (slice(2, 4), slice(0, 20), slice(9, 12))))
    doc.add_layer(_roi("far", "target", (slice(0, 20), slice(9, 20), slice(9, 12))))  # lines at y 9, 10, 11
    request = RoiSelection.of(doc)
    assert request.by == "ROIs seed, far"
    ((layer, selected),) = select_fibres(doc, request, device="cpu")
    layer.set_selection(selected, by=request.by)
    shown = shown_of(tract)
    assert (shown.shown, shown.total) == (int(selected.sum()), 10) and shown.shown == 3
    assert shown.text == f"{shown.shown} of 10 shown (selection by ROIs seed, far)"
    assert empty_selection_notice(tract) is None


@pytest.mark.gpu
def test_a_selection_on_the_gpu_gives_the_views_cache_its_ids_and_the_same_cells():
    """On the GPU the selected ids and counts come with the verdict and seed the display cache;
    the views' cells are those the CPU's selection leads to."""
    cells = {}
    for device in ("cpu", "gpu"):
        doc, _tract = _document_with_tracts(10)
        doc.add_layer(_roi("seed", "seed", (slice(2, 4), slice(0, 20), slice(9, 12))))
        doc.add_layer(_roi("far", "target", (slice(0, 20), slice(9, 20), slice(9, 12))))
        ((layer, selected),) = select_fibres(doc, RoiSelection.of(doc), device=device)
        seeded = doc.fiber_arrays._selections.get(layer)
        assert (seeded is not None and seeded[0] is selected) == (device == "gpu")
        full = doc.fiber_arrays.cells(layer, "full", selected)
        cells[device] = (selected, full.offsets, full.point_index())
    for a, b in zip(cells["cpu"], cells["gpu"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_selection_that_shows_nothing_says_why():
    _doc, tract = _document_with_tracts(4)
    tract.set_selection(np.zeros(4, bool), by="ROI target")
    assert shown_of(tract).text == "0 of 4 shown (selection by ROI target)"
    notice = empty_selection_notice(tract)
    assert "none of its 4 streamlines is shown" in notice and "Hide an ROI" in notice
    tract.set_selection(None)
    assert shown_of(tract).text == "all 4 shown" and tract.selection_by is None
    assert empty_selection_notice(tract) is None


def test_changing_only_what_made_a_selection_notifies_the_views():
    _doc, tract = _document_with_tracts(3)
    events = []
    tract.connect(lambda _s, event, **info: events.append(info.get("changed")))
    tract.set_selection(np.array([True, False, True]), by="ROI a")
    tract.set_selection(np.array([True, False, True]), by="ROI b")
    tract.set_selection(np.array([True, False, True]), by="ROI b")
    assert events == [["selection"], ["selection"]] and tract.selection_by == "ROI b"


def test_a_selection_is_counted_once_and_a_new_one_of_the_same_count_still_notifies(monkeypatch):
    """Every view reads the count of what a tractogram shows at every ROI edit (10 M flags at
    whole-brain scale): it is counted once per selection; an equal count alone never hides a
    change."""
    _doc, tract = _document_with_tracts(4)
    events = []
    tract.connect(lambda _s, event, **info: events.append(info.get("changed")))
    counted = []
    count_nonzero = np.count_nonzero
    monkeypatch.setattr(np, "count_nonzero", lambda a, *args, **kw: counted.append(1) or count_nonzero(a, *args, **kw))
    tract.set_selection(np.array([True, False, True, False]), by="ROI a")
    assert len(counted) == 1
    assert shown_of(tract).shown == tract.selected_count() == 2 and len(counted) == 1  # read, not counted again
    tract.set_selection(np.array([False, True, True, False]), by="ROI a")  # the same count, other streamlines
    assert events == [["selection"], ["selection"]] and shown_of(tract).shown == 2
    tract.selection = np.array([True, True, True, False])  # assigned another way (a session's): counted again
    assert tract.selected_count() == 3


def test_distance_rows_say_what_is_shown_and_never_print_inf():
    per = np.array([1.0, 3.0, 8.0, 20.0])
    (row,) = distance_rows("t", per, 5.0)
    assert row.shown == "all 4 shown" and row.within_margin == 2
    full, selected = distance_rows("t", per, 5.0, np.zeros(4, bool), "ROI target")
    assert full.streamlines == 4 and selected.streamlines == 0
    assert selected.shown == "0 of 4 shown (selection by ROI target)" and "0 of 4 shown" in full.shown
    assert selected.closest_text == "none (no streamline)" and "inf" not in selected.closest_text


def test_commit_shown_line_counts_what_the_selection_hides():
    from tractlens.widgets.commit_results import shown_label

    _doc, tract = _document_with_tracts(4)
    mask = np.ones(4, bool)
    assert shown_label(None, mask, tract) == "all 4 shown"
    tract.set_selection(np.zeros(4, bool), by="ROI target")
    assert shown_label(None, mask, tract) == "all 4 kept by weight; 0 of 4 shown (selection by ROI target)"


# ----------------------------------------------------------------------------- defect 5


def test_no_lesion_is_chosen_without_a_layer_marked_lesion():
    doc, _tract = _document_with_tracts(2)
    seed = doc.add_layer(_roi("seed", "seed", (5, 5, 5)))
    md = doc.add_layer(Layer("MD", Volume("MD", np.ones((20, 20, 20), np.float32), AFFINE), "scalar"))
    assert default_lesion(doc.layers) is None  # neither the newest ROI nor the newest map
    assert seed in lesion_choices(doc.layers) and md not in lesion_choices(doc.layers)
    assert doc.layer("FA") not in lesion_choices(doc.layers)
    assert md in lesion_choices(doc.layers, scalar_maps=True)  # only when asked for


def test_a_layer_marked_lesion_is_chosen():
    doc, _tract = _document_with_tracts(2)
    tumour = doc.add_layer(_roi("tumour", "seed", (5, 5, 5)))
    doc.add_layer(_roi("seed", "seed", (6, 6, 6)))
    assert default_lesion(doc.layers) is None
    doc.set_roi_role(tumour, "lesion")  # the ROI role, saved in sessions like every role
    assert default_lesion(doc.layers) is tumour
    named = doc.add_layer(Layer("lesion", Volume("lesion", np.zeros((20, 20, 20), np.uint8), AFFINE), "labels"))
    assert default_lesion(doc.layers) is named


def test_a_scalar_lesion_is_thresholded():
    data = np.zeros((20, 20, 20), np.float32)
    data[3, 3, 3], data[4, 4, 4] = 0.2, 0.9
    layer = Layer("prob", Volume("prob", data, AFFINE), "scalar")
    assert lesion_mask_of(layer, 0.5).sum() == 1 and lesion_mask_of(layer).sum() == 2


def test_a_lesion_roi_takes_no_part_in_tracking_or_selection():
    from tractlens.app.regions import regions_for

    doc, _tract = _document_with_tracts(3)
    doc.add_layer(_roi("tumour", "lesion", (5, 5, 5)))
    assert RoiSelection.of(doc) is None
    regions = regions_for(doc, "deterministic", doc.layer("FA").data)
    assert regions.seed is None and regions.must_pass == [] and regions.exclusion is None


def test_distance_from_a_point_to_the_lesion_in_mm_is_cached():
    doc, _tract = _document_with_tracts(1)
    lesion = doc.add_layer(_roi("tumour", "lesion", (10, 10, 10)))
    assert distance_to_lesion_mm(doc, lesion, [20.0, 20.0, 20.0]) == 0.0
    assert distance_to_lesion_mm(doc, lesion, [20.0, 26.0, 20.0]) == pytest.approx(6.0)  # 3 voxels of 2 mm
    assert distance_to_lesion_mm(doc, lesion, [26.0, 28.0, 20.0]) == pytest.approx(10.0)
    assert distance_to_lesion_mm(doc, lesion, [-50.0, 0.0, 0.0]) is None  # outside its grid
    first = lesion_distance_map(doc, lesion)
    assert lesion_distance_map(doc, lesion) is first
    doc.paint(lesion, np.array([[10, 13, 10]]), True)  # edited in place: measured again
    assert distance_to_lesion_mm(doc, lesion, [20.0, 26.0, 20.0]) == 0.0


def test_rois_select_only_the_tractograms_the_user_filters_by_them():
    doc, tract = _document_with_tracts(10)
    other = doc.add_layer(Layer("other", _lines(10), "tractogram"))  # filter_by_rois off: the default
    doc.add_layer(_roi("seed", "seed", (slice(2, 4), slice(0, 20), slice(9, 12))))
    request = RoiSelection.of(doc)
    assert request.tracts == (tract,) and other not in request.tracts
    tract.set(filter_by_rois=False)
    assert RoiSelection.of(doc) is None  # no tractogram is filtered: nothing to select
