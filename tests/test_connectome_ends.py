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
