"""Streamline points that leave the tracker in millimetres (gpu.streamlines.points_to_world, asked
for by StreamlineScalars.world): a run whose points only go to a file has them converted where
they are made, and the writer writes them as they are instead of converting them on the host.
On the NumPy backend the same code runs as on CuPy."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.app.io.tractogram import load_tractogram
from tractlens.app.io.tractogram_mapped import open_trx_mm
from tractlens.app.io.tractogram_points import points_world_float32
from tractlens.app.io.tractogram_stream import open_tractogram_writer
from tractlens.app.pipelines import track as track_pipeline
from tractlens.app.pipelines.track import deterministic_pipeline
from tractlens.app.pipelines.track_parts import PathLength, deterministic_part
from tractlens.gpu import deterministic
from tractlens.gpu.streamlines import StreamlineBatch, StreamlineScalars, points_to_world

from .test_det_scalars import PARAMS, _seeds
from .test_tractogram_stream import AFFINE, _curving_field


def _exact_mm(voxels: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Each point's millimetres summed in float64 and rounded to float32 once."""
    return (voxels.astype(np.float64) @ affine[:3, :3].T + affine[:3, 3]).astype(np.float32)


def test_points_to_world_rounds_each_point_once_whatever_the_pieces():
    rng = np.random.default_rng(5)
    voxels = (rng.random((1003, 3)) * 140).astype(np.float32)
    whole = points_to_world(np, voxels.copy(), AFFINE)
    for piece_points in (1, 7, 1 << 22):  # a piece of one point is padded: the same bits as many rows
        np.testing.assert_array_equal(points_to_world(np, voxels.copy(), AFFINE, piece_points), whole)
    np.testing.assert_array_equal(whole, _exact_mm(voxels, AFFINE))
    # the host's float32 product (what the writer made of voxel points) differs by its rounding
    # of the terms: a float32 step of the largest (about 1e-5 mm at 100 mm), not more
    np.testing.assert_allclose(whole, points_world_float32(voxels, AFFINE), rtol=0, atol=4e-5)


def test_the_tracker_gives_millimetres_when_asked_and_nothing_else_changes():
    """deterministic.track on the NumPy backend, batches of 41 seeds, with and without ``world``:
    the same streamlines and scalars; the points in millimetres, each rounded once."""
    field_ = _curving_field()
    tf = deterministic.prepare_field(field_.tensor, field_.voxel_size, field_.mask)
    seeds = _seeds(field_)

    def run(world: bool):
        scalars = StreamlineScalars(field_.fa, AFFINE, world=world)
        return list(deterministic.track(tf, seeds, PARAMS, device="cpu", max_batch=41, scalars=scalars))

    voxel, mm = run(False), run(True)
    assert len(mm) == len(voxel) > 5
    for a, b in zip(voxel, mm):
        assert (a.frame, b.frame) == ("voxel", "mm")
        np.testing.assert_array_equal(b.offsets, a.offsets)
        np.testing.assert_array_equal(b.point_scalars["fa"], a.point_scalars["fa"])
        np.testing.assert_array_equal(b.streamline_scalars["length_mm"], a.streamline_scalars["length_mm"])
        np.testing.assert_array_equal(b.points, _exact_mm(a.points, AFFINE))


def test_a_batch_keeps_its_frame_through_pieces_and_subsets_and_frames_do_not_mix():
    rng = np.random.default_rng(2)
    offsets = np.arange(0, 301, 10, dtype=np.int64)
    n = len(offsets) - 1

    def batch(frame):
        return StreamlineBatch(rng.random((300, 3)).astype(np.float32), offsets, np.arange(n),
                               np.zeros((n, 2), np.uint8), np.zeros(n, np.int64), frame=frame)  # fmt: skip

    mm = batch("mm")
    assert {p.frame for p in mm.pieces(40)} == {"mm"}
    assert mm.subset(np.arange(n) % 2 == 0).frame == "mm"
    assert StreamlineBatch.concatenate([mm, batch("mm")]).frame == "mm"
    with pytest.raises(ValueError, match="different frames"):
        StreamlineBatch.concatenate([mm, batch("voxel")])


def test_a_part_in_millimetres_holds_them_and_makes_voxels_only_when_read():
    field_ = _curving_field()
    tf = deterministic.prepare_field(field_.tensor, field_.voxel_size, field_.mask)
    (voxel,) = deterministic.track(tf, _seeds(field_), PARAMS, device="cpu",
                                   scalars=StreamlineScalars(field_.fa, AFFINE))  # fmt: skip
    (mm,) = deterministic.track(tf, _seeds(field_), PARAMS, device="cpu",
                                scalars=StreamlineScalars(field_.fa, AFFINE, world=True))  # fmt: skip
    part = deterministic_part(mm, field_.fa, AFFINE, field_.shape, "d", PathLength(AFFINE))
    assert part.mapped is not None and not part.mapped.made
    np.testing.assert_array_equal(part.mapped.world, mm.points)
    # read, the voxel coordinates are the millimetres brought back: within float32 rounding
    np.testing.assert_allclose(part.points, voxel.points, rtol=0, atol=2e-4)
    np.testing.assert_array_equal(part.point_scalars["fa"], voxel.point_scalars["fa"])


@pytest.mark.parametrize("suffix", [".trx", ".tck"])
def test_the_writer_writes_a_parts_millimetres_as_they_are(tmp_path, suffix):
    field_ = _curving_field()
    tf = deterministic.prepare_field(field_.tensor, field_.voxel_size, field_.mask)
    (mm,) = deterministic.track(tf, _seeds(field_), PARAMS, device="cpu",
                                scalars=StreamlineScalars(field_.fa, field_.affine, world=True))  # fmt: skip
    part = deterministic_part(mm, field_.fa, field_.affine, field_.shape, "d", PathLength(field_.affine))
    path = tmp_path / f"mm{suffix}"
    with open_tractogram_writer(path, field_.affine, field_.shape) as writer:
        writer.append(part)
    assert not part.mapped.made  # the writer did not make voxel coordinates
    if suffix == ".trx":
        stored = np.asarray(open_trx_mm(path).points)
        np.testing.assert_array_equal(stored, mm.points)  # bit for bit
    read = load_tractogram(path, (field_.affine, field_.shape))
    np.testing.assert_array_equal(read.offsets, part.offsets)
    np.testing.assert_allclose(read.points_world(), mm.points, rtol=0, atol=1e-4)


def test_the_pipeline_asks_for_millimetres_only_when_the_points_only_go_to_a_file(monkeypatch, tmp_path):
    """With the tracker computing as on a GPU (device_scalars made to answer as there): a run into
    a file gets its points in millimetres and writes what a run converting them on the host
    writes, within a float32 step of the terms; a run kept in memory, or filtered by an ROI, gets voxels."""
    field_ = _curving_field()
    asked = []

    def as_on_a_gpu(backend, field, to_file_only):
        asked.append(to_file_only)
        return StreamlineScalars(field.fa, field.affine, world=to_file_only)

    options = {"whole_brain": True, "params": PARAMS, "device": "cpu", "max_batch": 37}
    reference = deterministic_pipeline(field_, **options).tractogram
    monkeypatch.setattr(track_pipeline, "device_scalars", as_on_a_gpu)
    kept = deterministic_pipeline(field_, **options).tractogram
    assert asked and not any(asked) and kept.mapped is None
    np.testing.assert_array_equal(kept.points, reference.points)

    asked.clear()
    path = tmp_path / "whole.trx"
    written_parts = []
    with open_tractogram_writer(path, field_.affine, field_.shape, background=True) as writer:
        result = deterministic_pipeline(field_, sink=lambda p: (written_parts.append(p), writer.append(p)), **options)
    assert asked and all(asked) and result.tractogram is None
    # nothing on the way (the pipeline's counts, the writer) made voxel coordinates of them
    assert len(written_parts) > 3 and not any(p.mapped.made for p in written_parts)
    assert result.provenance["points"] == sum(p.n_points for p in written_parts) == len(reference.points)
    stored = np.asarray(open_trx_mm(path).points)
    np.testing.assert_array_equal(stored, _exact_mm(reference.points, field_.affine))
    np.testing.assert_allclose(stored, points_world_float32(reference.points, field_.affine), rtol=0, atol=4e-5)
    written = load_tractogram(path, (field_.affine, field_.shape))
    np.testing.assert_array_equal(written.point_scalars["fa"], reference.point_scalars["fa"])
    np.testing.assert_array_equal(written.streamline_scalars["length_mm"], reference.streamline_scalars["length_mm"])

    asked.clear()
    include = np.zeros(field_.shape, bool)
    include[field_.shape[0] // 2] = True
    filtered = []
    deterministic_pipeline(field_, sink=filtered.append, include=[include], **options)
    assert asked and not any(asked) and filtered and all(p.mapped is None for p in filtered)


@pytest.mark.gpu
def test_a_gpu_run_into_a_file_writes_its_millimetres_within_a_step_of_the_hosts(tmp_path):
    """On CuPy: the tracker's millimetres (float64 sums on the device) against the same run's
    voxel points converted on the host (the kept result's float32 product): a float32 step of
    the terms apart at most, and the float64 sums' rounding (cuBLAS may order the three terms
    otherwise: 1e-5 mm)."""
    field_ = _curving_field(40)
    options = {"whole_brain": True, "params": PARAMS, "device": "gpu", "max_batch": 500}
    kept = deterministic_pipeline(field_, **options).tractogram
    assert len(kept) > 1000
    path = tmp_path / "gpu.trx"
    with open_tractogram_writer(path, field_.affine, field_.shape, background=True) as writer:
        deterministic_pipeline(field_, sink=writer.append, **options)
    stored = np.asarray(open_trx_mm(path).points)
    np.testing.assert_allclose(stored, points_world_float32(kept.points, field_.affine), rtol=0, atol=4e-5)
    np.testing.assert_allclose(stored, _exact_mm(kept.points, field_.affine), rtol=0, atol=1e-5)
    written = load_tractogram(path, (field_.affine, field_.shape))
    np.testing.assert_array_equal(written.point_scalars["fa"], kept.point_scalars["fa"])
    np.testing.assert_array_equal(written.streamline_scalars["length_mm"], kept.streamline_scalars["length_mm"])


def _mm_and_voxel_parts():
    field_ = _curving_field()
    tf = deterministic.prepare_field(field_.tensor, field_.voxel_size, field_.mask)
    seeds = _seeds(field_)
    mm = deterministic.track(tf, seeds, PARAMS, device="cpu", max_batch=200,
                             scalars=StreamlineScalars(field_.fa, field_.affine, world=True))  # fmt: skip
    voxel = deterministic.track(tf, seeds, PARAMS, device="cpu", max_batch=200,
                                scalars=StreamlineScalars(field_.fa, field_.affine))  # fmt: skip
    path_length = PathLength(field_.affine)
    parts = [deterministic_part(b, field_.fa, field_.affine, field_.shape, "d", path_length) for b in mm]
    path_length = PathLength(field_.affine)
    plain = [deterministic_part(b, field_.fa, field_.affine, field_.shape, "d", path_length) for b in voxel]
    return field_, parts, plain


def test_a_run_that_falls_back_to_the_cpu_writes_parts_of_both_frames(tmp_path):
    """A GPU run out of memory goes on on the CPU: its first parts come in millimetres, the rest in
    voxels. One file takes both, each converted (or not) as it is."""
    field_, mm_parts, voxel_parts = _mm_and_voxel_parts()
    assert len(mm_parts) > 3
    half = len(mm_parts) // 2
    mixed = mm_parts[:half] + voxel_parts[half:]
    path = tmp_path / "mixed.trx"
    with open_tractogram_writer(path, field_.affine, field_.shape, background=True) as writer:
        for part in mixed:
            writer.append(part)
    stored = np.asarray(open_trx_mm(path).points)
    expected = np.concatenate(
        [p.mapped.world for p in mm_parts[:half]]
        + [points_world_float32(p.points, field_.affine) for p in voxel_parts[half:]]
    )
    np.testing.assert_array_equal(stored, expected)


def test_a_tractogram_mapped_from_a_trx_file_is_written_with_the_files_millimetres(tmp_path):
    """Saved again, a .trx opened as it is stored keeps its float32 millimetres to the bit (before,
    they went through voxel coordinates and back)."""
    field_, mm_parts, _ = _mm_and_voxel_parts()
    first = tmp_path / "first.trx"
    with open_tractogram_writer(first, field_.affine, field_.shape) as writer:
        for part in mm_parts:
            writer.append(part)
    opened = load_tractogram(first)
    assert opened.mapped is not None and opened.mapped.checked
    again = tmp_path / "again.trx"
    with open_tractogram_writer(again, opened.affine, opened.dimensions) as writer:
        writer.append(opened)
    assert not opened.mapped.made
    np.testing.assert_array_equal(np.asarray(open_trx_mm(again).points), np.asarray(open_trx_mm(first).points))
