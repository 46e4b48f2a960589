"""Level-of-detail index sets and VTK connectivity for fiber display (pure NumPy)."""

import itertools

import numpy as np

from tractlens.app.fiber_arrays import subset


def test_decimated_subset_keeps_whole_streamlines_with_their_ends(rng):
    lengths = rng.integers(2, 60, 20_000)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    index, new_offsets, kept = subset(offsets, 50_000, decimate=True)
    assert len(index) == new_offsets[-1] <= 60_000
    line_of = np.searchsorted(offsets, index, side="right") - 1
    np.testing.assert_array_equal(np.unique(line_of), kept)
    for a, b in itertools.pairwise(new_offsets):
        ids, lines = index[a:b], line_of[a:b]
        assert (lines == lines[0]).all() and np.all(np.diff(ids) > 0)
        assert ids[0] == offsets[lines[0]] and ids[-1] == offsets[lines[0] + 1] - 1
    assert subset(offsets, int(offsets[-1]), decimate=True) is None  # small enough: everything


def test_undecimated_subset_keeps_every_point_of_the_chosen_streamlines(rng):
    lengths = np.full(1000, 50)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    _index, new_offsets, kept = subset(offsets, 10_000, decimate=False)
    assert len(new_offsets) - 1 == len(kept) == 200 and np.all(np.diff(new_offsets) == 50)
