"""FA per point and length per streamline computed where the points are made
(gpu.streamlines.StreamlineScalars, through the backend's array module before the copy to the
host): on the NumPy backend the same code gives exactly what the host computes piece by piece."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.app.pipelines import track as track_pipeline
from tractlens.app.pipelines import track_parts
from tractlens.app.pipelines.track import deterministic_pipeline
from tractlens.app.pipelines.track_parts import PathLength, deterministic_part
from tractlens.gpu import deterministic
from tractlens.gpu.streamlines import StreamlineBatch, StreamlineScalars

from .test_tractogram_stream import AFFINE, _curving_field

PARAMS = deterministic.DeterministicParams(min_length_mm=0.0)


def _seeds(field_, per_voxel: int = 1):
    mask = track_pipeline.whole_brain_seeds(field_, None, PARAMS.fa_threshold)
    return track_pipeline.seeds_in_mask(mask, per_voxel)


def _host_scalars(batches, field_, affine):
    """What the pipeline computes on the host: pieces of a few points, one running PathLength."""
    path_length = PathLength(affine)
    fa, lengths = [], []
    for batch in batches:
        plain = StreamlineBatch(batch.points, batch.offsets, batch.seed_index, batch.stop, batch.seed_point)
        for piece in plain.pieces(50):
            part = deterministic_part(piece, field_.fa, affine, field_.shape, "d", path_length)
            fa.append(part.point_scalars["fa"])
            lengths.append(part.streamline_scalars["length_mm"])
    return np.concatenate(fa), np.concatenate(lengths)


@pytest.mark.parametrize("piece_points", [37, 1 << 22])
def test_scalars_made_with_the_points_equal_the_host_ones(monkeypatch, piece_points):
    """Through deterministic.track on the NumPy backend (batches of 41 seeds; device pieces
    smaller than a streamline, or whole batches): bit for bit the host's values, in float32."""
    field_ = _curving_field()
    affine = AFFINE.copy()  # oblique and anisotropic: the rotation matters to the lengths
    real_compute = StreamlineScalars.compute
    monkeypatch.setattr(
        StreamlineScalars,
        "compute",
        lambda self, *a, **k: real_compute(self, *a, **{**k, "piece_points": piece_points}),
    )
    tf = deterministic.prepare_field(field_.tensor, field_.voxel_size, field_.mask)
    scalars = StreamlineScalars(field_.fa, affine)
    batches = list(deterministic.track(tf, _seeds(field_), PARAMS, device="cpu", max_batch=41, scalars=scalars))
    assert len(batches) > 5
    for batch in batches:
        assert batch.point_scalars["fa"].dtype == np.float32 and len(batch.point_scalars["fa"]) == len(batch.points)
        assert batch.streamline_scalars["length_mm"].dtype == np.float32
        assert len(batch.streamline_scalars["length_mm"]) == len(batch)
    fa, lengths = _host_scalars(batches, field_, affine)
    np.testing.assert_array_equal(np.concatenate([b.point_scalars["fa"] for b in batches]), fa)
    np.testing.assert_array_equal(np.concatenate([b.streamline_scalars["length_mm"] for b in batches]), lengths)
    assert fa.max() > 0.3 and lengths.max() > 10 * PARAMS.step_mm  # real values, not zeros


def test_the_pipeline_keeps_scalars_made_on_the_device(monkeypatch):
    """The pipeline with the tracker computing the scalars (as on a GPU) writes the same
    tractogram as with the host computing them; the host does not sample FA again."""
    field_ = _curving_field()
    options = {"whole_brain": True, "params": PARAMS, "device": "cpu", "max_batch": 37}
    reference = deterministic_pipeline(field_, **options).tractogram
    real_track = deterministic.track
    made = []

    def track_with_scalars(*args, scalars=None, **kwargs):
        assert scalars is None  # the CPU engine leaves them to the host
        made.append(StreamlineScalars(field_.fa, field_.affine))
        return real_track(*args, scalars=made[-1], **kwargs)

    def no_host_sampling(*args, **kwargs):
        raise AssertionError("FA sampled on the host again")

    monkeypatch.setattr(deterministic, "track", track_with_scalars)
    monkeypatch.setattr(track_parts, "sample_volume", no_host_sampling)
    monkeypatch.setattr(track_pipeline, "PIECE_POINTS", 50)
    ours = deterministic_pipeline(field_, **options).tractogram
    assert made and len(ours) == len(reference) > 100
    np.testing.assert_array_equal(ours.points, reference.points)
    np.testing.assert_array_equal(ours.offsets, reference.offsets)
    np.testing.assert_array_equal(ours.point_scalars["fa"], reference.point_scalars["fa"])
    np.testing.assert_array_equal(ours.streamline_scalars["length_mm"], reference.streamline_scalars["length_mm"])


def test_subset_pieces_and_concatenate_carry_the_scalars():
    rng = np.random.default_rng(3)
    counts = rng.integers(1, 30, 40)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n, p = len(counts), int(offsets[-1])
    batch = StreamlineBatch(
        rng.random((p, 3)).astype(np.float32),
        offsets,
        np.arange(n),
        np.zeros((n, 2), np.uint8),
        np.zeros(n, np.int64),
        {},
        {"fa": np.arange(p, dtype=np.float32)},
        {"length_mm": np.arange(n, dtype=np.float32)},
    )

    def consistent(b: StreamlineBatch) -> None:
        for i in range(len(b)):  # each point's fa is its index in the first batch: the points match
            np.testing.assert_array_equal(
                batch.points[b.point_scalars["fa"][b.offsets[i] : b.offsets[i + 1]].astype(int)], b[i]
            )
            assert b.streamline_scalars["length_mm"][i] == b.seed_index[i]

    keep = rng.random(n) < 0.5
    consistent(batch.subset(keep))
    pieces = list(batch.pieces(60))
    assert len(pieces) > 5
    for piece in pieces:
        consistent(piece)
    joined = StreamlineBatch.concatenate(pieces)
    consistent(joined)
    np.testing.assert_array_equal(joined.point_scalars["fa"], batch.point_scalars["fa"])


@pytest.mark.gpu
def test_scalars_on_the_gpu_match_the_host_on_the_same_points():
    """On CuPy (the GPU pipeline): FA per point and lengths of the GPU's own streamlines equal
    what the host computes from them, within float rounding (summation order on the device)."""
    field_ = _curving_field(40)
    gpu = deterministic_pipeline(field_, whole_brain=True, params=PARAMS, device="gpu", max_batch=500).tractogram
    assert len(gpu) > 1000
    host = deterministic_part(
        StreamlineBatch(gpu.points, gpu.offsets, np.zeros(len(gpu)), np.zeros((len(gpu), 2)), np.zeros(len(gpu))),
        field_.fa,
        field_.affine,
        field_.shape,
        "d",
        PathLength(field_.affine),
    )
    np.testing.assert_allclose(gpu.point_scalars["fa"], host.point_scalars["fa"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(gpu.streamline_scalars["length_mm"], host.streamline_scalars["length_mm"], rtol=1e-5)
    assert gpu.streamline_scalars["length_mm"].max() > 10


@pytest.mark.parametrize("x_sign", [1.0, -1.0])
def test_the_tracking_view_of_a_tensor_file_is_in_c_order_whatever_its_handedness(tmp_path, x_sign):
    """A tensor file is read in Fortran order and copied (C order) only when its affine's positive
    determinant flips the x components: the tracking view is C-ordered either way, so the GPU
    samples FA with the same kernels on every subject (the demo and the benchmark's subjects
    are of opposite handedness)."""
    from tractlens.app.io.tensor import save_tensor

    field_ = _curving_field()
    affine = np.diag([x_sign * 2.0, 2.0, 2.0, 1.0])
    path = save_tensor(field_.tensor, affine, tmp_path / "tensor.nii.gz")
    loaded = track_pipeline.load_tensor_field(tensor=str(path), tensor_order="fsl")
    assert loaded.tensor.flags.c_contiguous and loaded.fa.flags.c_contiguous
    np.testing.assert_allclose(loaded.fa, field_.fa, atol=1e-6)


def test_scalars_sample_a_fortran_ordered_volume_in_c_order():
    field_ = _curving_field()
    fortran = np.asfortranarray(field_.fa)
    scalars = StreamlineScalars(fortran, AFFINE)
    points = np.array([[1.2, 2.5, 0.7], [3.0, 1.0, 2.0]], np.float32)
    fa, _ = scalars.compute(np, points, np.array([0, 2]))
    assert scalars._on[1].flags.c_contiguous
    np.testing.assert_array_equal(
        fa["fa"], StreamlineScalars(field_.fa, AFFINE).compute(np, points, np.array([0, 2]))[0]["fa"]
    )
