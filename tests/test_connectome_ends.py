"""The connectome converts only the streamlines' ends onto the labels' grid (a whole-brain
tractogram's hundreds of millions of points are not all transformed): the same assignment and
matrix as converting every point."""

from __future__ import annotations

import numpy as np

from tractlens.app.model import Volume
from tractlens.app.pipelines.connectivity import compute_connectome
from tractlens.app.tractogram import Tractogram
from tractlens.gpu.connectivity import assign_endpoints


def _case(rng):
    labels = rng.integers(0, 6, (12, 11, 10)).astype(np.int32)
    affine_labels = np.diag([2.0, 2.0, 2.0, 1.0])
    affine_labels[:3, 3] = [-3.0, 1.0, 2.5]
    affine_tract = np.array([[1.0, 0.1, 0, -1], [0, 0.9, 0, 2], [0.05, 0, 1.1, 0.5], [0, 0, 0, 1]])
    lengths = [5, 1, 0, 7, 2, 0, 3]  # single-point and empty streamlines too
    points = rng.uniform(0, 18, (sum(lengths), 3)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tract = Tractogram(points, offsets, affine_tract, (20, 20, 20))
    return tract, Volume("labels", labels, affine_labels, kind="labels")


def test_the_ends_on_another_grid_are_those_of_every_point_converted():
    tract, labels = _case(np.random.default_rng(0))
    ends, offsets = tract.ends_on(labels.affine)
    every = tract.points_on(labels.affine)
    lengths = tract.lengths
    has = lengths > 0
    want = np.stack([every[tract.offsets[:-1][has]], every[tract.offsets[1:][has] - 1]], axis=1).reshape(-1, 3)
    np.testing.assert_allclose(ends, want, rtol=0, atol=1e-12)
    assert offsets.tolist() == [0, 2, 4, 4, 6, 8, 8, 10]


def test_the_connectome_from_the_ends_equals_the_assignment_of_every_point():
    tract, labels = _case(np.random.default_rng(1))
    every = assign_endpoints(tract.points_on(labels.affine), tract.offsets, labels.data, labels.affine[:3, :3],
                             radius_mm=3.0, device="cpu")  # fmt: skip
    result = compute_connectome(tract, labels, radius_mm=3.0, device="cpu")
    counts = np.zeros_like(result.counts)
    nodes = [int(n.removeprefix("label_")) for n in result.row_names]
    for a, b in every.labels:
        if a > 0 and b > 0:
            i, j = nodes.index(a), nodes.index(b)
            counts[i, j] += 1
            if i != j:
                counts[j, i] += 1
    np.testing.assert_array_equal(result.counts, counts)
    assert counts.sum() > 0


def test_a_trx_read_to_its_ends_gives_the_ends_of_the_whole_load(tmp_path, demo_dir):
    """From an uncompressed .trx the ends are read off its map and converted alone: the same
    float32 voxel coordinates as the whole file loaded, the per-streamline scalars kept, and the
    same connectome."""
    from tractlens.app.io import load_tractogram, load_volume, save_tractogram
    from tractlens.app.io.tractogram_ends import load_tractogram_ends, tractogram_ends

    whole = load_tractogram(demo_dir / "bundles.trk")
    empty = Tractogram(np.zeros((0, 3), np.float32), np.array([0, 0]), whole.affine, whole.dimensions,
                       streamline_scalars={k: np.zeros(1, np.float32) for k in whole.streamline_scalars})  # fmt: skip
    mixed = Tractogram.concatenate([whole, empty, whole.subset(np.arange(5))])
    path = save_tractogram(mixed, tmp_path / "t.trx")
    from tractlens.app.io.tractogram_mapped import open_trx_mm

    assert open_trx_mm(path) is not None  # the map's path, not a whole load
    full = load_tractogram(path)
    ends = load_tractogram_ends(path)
    cut = tractogram_ends(full)
    np.testing.assert_array_equal(ends.points, cut.points)
    np.testing.assert_array_equal(ends.offsets, cut.offsets)
    assert len(ends) == len(full) and set(ends.streamline_scalars) == set(full.streamline_scalars)
    labels = load_volume(demo_dir / "parcellation.nii.gz", kind="labels")
    np.testing.assert_array_equal(compute_connectome(ends, labels, device="cpu").counts,
                                  compute_connectome(full, labels, device="cpu").counts)  # fmt: skip
    trk = load_tractogram_ends(demo_dir / "bundles.trk")  # any other format: loaded whole, then cut
    np.testing.assert_array_equal(trk.points, tractogram_ends(whole).points)
