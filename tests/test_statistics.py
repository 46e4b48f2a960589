"""Tract and ROI statistics (app.statistics) and `tractlens stats`, against values worked out by hand."""

from __future__ import annotations

import csv
import json

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.cli import main
from tractlens.app.model import Document, Layer, RoiMask, Tractogram, Volume
from tractlens.app.statistics import (
    StatisticsParams,
    layer_statistics,
    roi_statistics,
    statistics_csv_text,
    tract_statistics,
)

AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])  # 2 mm voxels: 8 mm³ each


def _tract() -> Tractogram:
    """Two straight streamlines along x: 10 and 20 voxels long (20 and 40 mm)."""
    a = np.column_stack([np.arange(0, 11), np.full(11, 1), np.full(11, 1)])
    b = np.column_stack([np.arange(0, 21), np.full(21, 3), np.full(21, 1)])
    return Tractogram.from_list([a, b], affine=AFFINE, dimensions=(30, 10, 10), name="two")


def _ramp() -> Volume:
    """A map whose value is the voxel's x index."""
    data = np.broadcast_to(np.arange(30, dtype=np.float32)[:, None, None], (30, 10, 10)).copy()
    return Volume("ramp", data, AFFINE)


def _q(table, name):
    return next(q for q in table.quantities if q.name == name)


def test_tract_statistics_by_hand():
    table = tract_statistics(_tract(), None, {"ramp": _ramp()})
    assert _q(table, "streamlines shown").value == 2 and _q(table, "streamlines in total").value == 2
    length = _q(table, "length mean")
    assert length.value == pytest.approx(30.0) and length.sd == pytest.approx(np.std([20, 40], ddof=1))
    assert _q(table, "volume of voxels visited").value == pytest.approx((11 + 21) * 8.0)
    values = np.concatenate([np.arange(11), np.arange(21)])
    ramp = _q(table, "ramp along mean")
    assert ramp.value == pytest.approx(values.mean()) and ramp.sd == pytest.approx(values.std(ddof=1))
    assert _q(table, "length mean").text == f"30 ± {np.std([20, 40], ddof=1):.3g} mm"


def test_only_the_shown_streamlines_are_measured_and_an_empty_selection_prints_none():
    table = tract_statistics(_tract(), np.array([False, True]), {"ramp": _ramp()}, by="ROI x")
    assert _q(table, "streamlines shown").value == 1 and _q(table, "streamlines in total").value == 2
    assert _q(table, "length mean").value == pytest.approx(40.0)
    assert "1 of 2 streamlines shown (selection by ROI x)" in table.note
    empty = tract_statistics(_tract(), np.array([False, False]), {"ramp": _ramp()})
    assert _q(empty, "length mean").value is None and _q(empty, "length mean").text == "none"
    assert _q(empty, "ramp along mean").text == "none"
    text = statistics_csv_text([empty])
    assert "nan" not in text.lower() and "inf" not in text.lower()


def test_trilinear_sampling_between_voxels():
    tract = Tractogram.from_list([np.array([[0.5, 1, 1], [2.5, 1, 1]])], affine=AFFINE, dimensions=(30, 10, 10))
    nearest = tract_statistics(tract, None, {"ramp": _ramp()})
    trilinear = tract_statistics(tract, None, {"ramp": _ramp()}, params=StatisticsParams("trilinear"))
    assert _q(trilinear, "ramp along mean").value == pytest.approx(1.5)
    assert _q(nearest, "ramp along mean").value == pytest.approx(1.0)  # rint: 0 and 2
    with pytest.raises(ValueError):
        StatisticsParams("cubic")


def test_a_large_tractogram_is_measured_block_by_block_as_whole(monkeypatch, tmp_path):
    """In blocks of a few points (as a whole-brain tractogram is, in bounded memory) the
    statistics are those of all points at once, worked out here with NumPy: per-streamline
    lengths, distinct voxels (points beyond the grid too), a map's mean ± sd; a selection; a
    memory-mapped .trx's voxel coordinates are never made whole; cancel stops it."""
    from tractlens.app import statistics
    from tractlens.app.io import load_tractogram, save_tractogram
    from tractlens.gpu.backend import Cancelled

    rng = np.random.default_rng(4)
    lines = [
        np.cumsum(rng.normal(0, 0.7, (int(rng.integers(2, 40)), 3)), axis=0) + np.array([14, 5, 5]) for _ in range(300)
    ]
    lines[7] = np.vstack([lines[7], [[-3.2, 4.0, 4.0]]])  # a point two voxels beyond the grid
    tract = Tractogram.from_list(lines, affine=AFFINE, dimensions=(30, 10, 10), name="walks")
    shown = rng.random(len(lines)) < 0.6
    points = np.asarray(tract.points, dtype=np.float64)
    keep = np.repeat(shown, tract.lengths)
    stored = np.split(points, tract.offsets[1:-1])  # the tractogram's own (float32) points
    lengths = np.array([np.linalg.norm(np.diff(p, axis=0) @ AFFINE[:3, :3].T, axis=1).sum() for p in stored])[shown]
    voxels = len(np.unique(np.rint(points[keep]).astype(np.int64), axis=0))
    values = statistics.sample_map(_ramp(), points[keep])
    values = values[np.isfinite(values)]
    monkeypatch.setattr(statistics, "BLOCK_POINTS", 37)
    steps = []
    table = tract_statistics(tract, shown, {"ramp": _ramp()}, progress=lambda done, total: steps.append(total))
    assert len(steps) > 50
    length = _q(table, "length mean")
    assert length.value == pytest.approx(lengths.mean(), rel=1e-12) and length.sd == pytest.approx(lengths.std(ddof=1))
    assert _q(table, "volume of voxels visited").value == pytest.approx(voxels * 8.0)
    ramp = _q(table, "ramp along mean")
    assert ramp.value == pytest.approx(values.mean(), rel=1e-12) and ramp.sd == pytest.approx(values.std(ddof=1))
    with pytest.raises(Cancelled):
        tract_statistics(tract, shown, cancelled=lambda: True)

    path = tmp_path / "walks.trx"
    save_tractogram(Tractogram.from_list([line.clip(0, 9) for line in lines], affine=AFFINE, dimensions=(30, 10, 10)),
                    path)  # fmt: skip
    mapped = load_tractogram(path)
    assert mapped.mapped is not None
    table = tract_statistics(mapped, None, {"ramp": _ramp()})
    assert _q(table, "streamlines shown").value == 300 and not mapped.mapped.made
    # a selection of the mapped file: its shown streamlines' rows read alone, the same numbers
    selected = tract_statistics(mapped, shown, {"ramp": _ramp()})
    other = load_tractogram(path)  # its voxel coordinates made whole: the plain array's way
    plain = Tractogram(np.asarray(other.points), other.offsets, other.affine, other.dimensions)
    in_memory = tract_statistics(plain, shown, {"ramp": _ramp()})
    assert [q.value for q in selected.quantities] == pytest.approx([q.value for q in in_memory.quantities], rel=1e-12)
    assert _q(selected, "streamlines shown").value == shown.sum() and not mapped.mapped.made


def test_roi_statistics_by_hand():
    mask = np.zeros((30, 10, 10), bool)
    mask[4:7, 2, 2] = True
    table = roi_statistics(mask, AFFINE, {"ramp": _ramp()}, name="box")
    assert _q(table, "voxels").value == 3 and _q(table, "volume").value == pytest.approx(24.0)
    assert _q(table, "ramp inside mean").value == pytest.approx(5.0) and _q(table, "ramp inside mean").sd == 1.0
    empty = roi_statistics(np.zeros((30, 10, 10), bool), AFFINE, {"ramp": _ramp()})
    assert empty.note == "the ROI is empty" and _q(empty, "ramp inside mean").value is None


def test_layer_statistics_use_the_layer_selection_and_every_open_scalar_map():
    doc = Document()
    doc.add_layer(Layer("ramp", _ramp(), "scalar"))
    tract = doc.add_layer(Layer("two", _tract(), "tractogram"))
    tract.set_selection(np.array([True, False]), by="ROI seed")
    table = layer_statistics(doc, tract)
    assert _q(table, "streamlines shown").value == 1 and "selection by ROI seed" in table.note
    assert _q(table, "ramp along mean").value == pytest.approx(5.0)
    mask = np.zeros((30, 10, 10), bool)
    mask[0, 0, 0] = True
    roi = doc.add_layer(Layer("r", RoiMask("r", mask, AFFINE), "roi"))
    assert _q(layer_statistics(doc, roi), "voxels").value == 1


def test_stats_command_writes_csv_and_json(tmp_path, capsys):
    from tractlens.app.io import save_tractogram

    save_tractogram(_tract(), tmp_path / "two.trk")
    nib.save(nib.Nifti1Image(_ramp().data, AFFINE), tmp_path / "ramp.nii.gz")
    mask = np.zeros((30, 10, 10), np.uint8)
    mask[4:7, 2, 2] = 1
    nib.save(nib.Nifti1Image(mask, AFFINE), tmp_path / "box.nii.gz")
    args = [str(tmp_path / "two.trk"), "--roi", str(tmp_path / "box.nii.gz"), "--map", str(tmp_path / "ramp.nii.gz")]
    assert main(["stats", *args, "-o", str(tmp_path / "s.csv"), "--quiet"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    by = {(r["subject"], r["quantity"]): r for r in rows}
    assert float(by[("two.trk", "length mean")]["value"]) == pytest.approx(30.0, rel=1e-4)
    assert float(by[("box", "ramp inside mean")]["value"]) == pytest.approx(5.0)
    assert main(["stats", "--roi", str(tmp_path / "box.nii.gz"), "-o", str(tmp_path / "s.json"), "--json"]) == 0
    tables = json.loads((tmp_path / "s.json").read_text())
    assert tables[0]["kind"] == "roi" and tables[0]["quantities"][0]["value"] == 3
    assert main(["stats", "-o", str(tmp_path / "none.csv")]) == 2  # nothing to measure
    assert main(["stats", "--roi", str(tmp_path / "box.nii.gz"), "-o", str(tmp_path / "s.txt")]) == 2
    assert "nothing to measure" in capsys.readouterr().err


def test_diffusivity_maps_carry_their_unit_into_the_table_and_the_csv():
    from tractlens.app.statistics import map_unit, roi_statistics, statistics_csv_text

    assert map_unit("MD") == map_unit("dti_RD") == map_unit("AD") == "mm²/s"
    assert map_unit("FA") == "" and map_unit("visitation") == ""
    affine = np.eye(4)
    mask = np.zeros((4, 4, 4), bool)
    mask[1:3, 1:3, 1:3] = True
    md = Volume("MD", np.full((4, 4, 4), 7e-4, np.float32), affine)
    table = roi_statistics(mask, affine, {"MD": md, "FA": Volume("FA", np.full((4, 4, 4), 0.5), affine)})
    by_name = {q.name: q for q in table.quantities}
    assert by_name["MD inside mean"].unit == "mm²/s" and by_name["MD inside mean"].text.endswith("mm²/s")
    assert by_name["FA inside mean"].unit == ""
    assert ",MD inside mean,0.0007" in statistics_csv_text([table]) and "mm²/s" in statistics_csv_text([table])
