"""COMMIT's EC compartments without a peaks file (gpu.commit_ec): a voxel's main orientations
among its segments, at most k, 25° apart, none below 0.1 of the largest; 0 keeps the former
one-per-distinct-orientation compartments exactly."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.gpu.commit import CommitParams, orientation_index
from tractlens.gpu.commit_ec import ec_main_orientations, main_orientations
from tractlens.gpu.commit_operator import ec_from_segments
from tractlens.gpu.commit_segments import Segments


def _orient(*vectors):
    return orientation_index(np.array(vectors, dtype=np.float64)).astype(np.int64)


def _voxel():
    """Row 0: a bundle along x spread over three 1° bins (lengths 5, 3, 2), a crossing along y
    (lengths 4 and 1 on two bins), a minor one along z (0.4: below 0.1 of 5) and one at 10° from
    x (2.5: within 25° of the bundle). Row 1: one orientation."""
    x, x1, x2 = (
        (1, 0, 0),
        (np.cos(np.radians(1)), np.sin(np.radians(1)), 0),
        (np.cos(np.radians(2)), 0, np.sin(np.radians(2))),
    )
    y, y1 = (0, 1, 0), (np.sin(np.radians(1)), np.cos(np.radians(1)), 0)
    ten = (np.cos(np.radians(10)), np.sin(np.radians(10)), 0)
    o = _orient(x, x1, x2, y, y1, (0, 0, 1), ten, y)
    length = np.array([5.0, 3.0, 2.0, 4.0, 1.0, 0.4, 2.5, 1.0])
    row = np.array([0, 0, 0, 0, 0, 0, 0, 1])
    return row, o, length


def test_main_orientations_pick_the_largest_apart_and_above_the_threshold():
    row, o, length = _voxel()
    r, picked = main_orientations(row, o, length, 3)
    np.testing.assert_array_equal(r, [0, 0, 1])
    assert set(picked[:2].tolist()) == {o[0], o[3]}  # the bundle's and the crossing's largest bins
    assert picked[2] == o[7]
    r, picked = main_orientations(row, o, length, 1)
    np.testing.assert_array_equal(r, [0, 1])
    np.testing.assert_array_equal(picked, [o[0], o[7]])


def test_segments_of_one_orientation_add_up_and_ties_go_to_the_lower_index():
    o = _orient((1, 0, 0), (0, 1, 0))
    row = np.zeros(4, dtype=np.int64)
    orient = np.array([o[1], o[0], o[1], o[0]])
    length = np.array([1.0, 1.5, 1.0, 0.4])  # 2.0 on o[1], 1.9 on o[0]
    np.testing.assert_array_equal(main_orientations(row, orient, length, 1)[1], [o[1]])
    length = np.array([1.0, 1.0, 1.0, 1.0])  # 2.0 each: the lower index
    np.testing.assert_array_equal(main_orientations(row, orient, length, 1)[1], [min(o)])


def _random_segments(seed: int, n_rows: int = 300, n: int = 20_000):
    rng = np.random.default_rng(seed)
    row = np.sort(rng.integers(0, n_rows, n)).astype(np.int32)
    orient = rng.integers(0, 32761, n).astype(np.uint16)
    orient[rng.random(n) < 0.5] = 90 * 181 + 90  # a common orientation in every voxel
    return Segments(row, rng.integers(0, 50, n).astype(np.int32), rng.uniform(0.01, 1.0, n).astype(np.float32),
                    orient, 50)  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1])
def test_chunks_of_whole_rows_give_what_all_at_once_gives(monkeypatch, seed):
    from tractlens.gpu import commit_ec

    seg = _random_segments(seed)
    whole = main_orientations(seg.row, seg.orient, seg.length, 3)
    monkeypatch.setattr(commit_ec, "CHUNK_SEGMENTS", 777)
    chunked = ec_main_orientations(seg, 3)
    for got, want in zip(chunked, whole, strict=True):
        np.testing.assert_array_equal(got, want)
    counts = np.bincount(chunked[0])
    assert counts.max() <= 3 and (np.diff(chunked[0]) >= 0).all()
    common = chunked[0][chunked[1] == 90 * 181 + 90]
    np.testing.assert_array_equal(common, np.unique(chunked[0]))  # each voxel's largest is picked


def test_the_pipeline_makes_at_most_k_a_voxel_and_zero_keeps_the_former_compartments(demo_dir):
    from tractlens.app.io import load_dwi, load_tractogram
    from tractlens.app.pipelines.commit import commit_pipeline

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    tract = load_tractogram(demo_dir / "bundles.trk", reference=(dwi.affine, dwi.shape3))
    assert CommitParams().ec_orientations == 0  # the default keeps the validated compartments
    main = commit_pipeline(dwi, tract, params=CommitParams(max_iter=5, ec_orientations=3), device="cpu")
    every = commit_pipeline(dwi, tract, params=CommitParams(max_iter=5), device="cpu")
    assert np.bincount(main.problem.ec_row).max() <= 3
    former = ec_from_segments(every.problem.segments)
    np.testing.assert_array_equal(every.problem.ec_row, former[0])
    np.testing.assert_array_equal(every.problem.ec_orient, former[1])
    assert every.problem.n_ec > main.problem.n_ec
    with pytest.raises(ValueError, match="ec_orientations"):
        CommitParams(ec_orientations=-1)


@pytest.mark.gpu
def test_main_orientations_on_the_device_equal_the_host():
    """On CuPy (the same array operations): exactly the host's compartments."""
    from tractlens.gpu.backend import get_backend

    seg = _random_segments(3)
    xp = get_backend("gpu").xp
    device = Segments(xp.asarray(seg.row), xp.asarray(seg.fiber), xp.asarray(seg.length.astype(np.float64)),
                      xp.asarray(seg.orient), seg.n_fibers)  # fmt: skip
    host64 = Segments(seg.row, seg.fiber, seg.length.astype(np.float64), seg.orient, seg.n_fibers)
    for got, want in zip(ec_main_orientations(device, 3), ec_main_orientations(host64, 3), strict=True):
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, want)
