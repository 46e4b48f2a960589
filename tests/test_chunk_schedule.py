"""The chunk schedule of a shared run (gpu.multidevice.ChunkQueue): every item handed out once,
large chunks first, no crumb at the end, one device's chunks all of the largest size; and sums of
probabilistic chunks taken in any order equal one run (the property the split relies on)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tractlens.gpu.multidevice import ChunkQueue


def _drain(queue: ChunkQueue) -> list[tuple[int, int]]:
    out = []
    while (r := queue.take()) is not None:
        out.append(r)
    return out


CASES = [(102_056_000, p, 8_000_000, s) for p in (1, 2, 4, 8) for s in (1 << 18, 1 << 20, 1 << 21)]
CASES += [(1000, 4, 100, 5), (7, 3, 4, 2), (5, 4, 8, 16), (1, 2, 1, 1), (33, 1, 8, 4), (999_983, 3, 50_000, 7_919)]


@pytest.mark.parametrize("total,parts,largest,smallest", CASES)
def test_every_item_is_handed_out_once_in_chunks_between_half_the_smallest_and_the_largest(
    total, parts, largest, smallest
):
    chunks = _drain(ChunkQueue(total, parts, largest, smallest))
    starts = [s for s, _ in chunks]
    sizes = np.array([c for _, c in chunks])
    assert starts == list(np.concatenate([[0], np.cumsum(sizes)[:-1]]))  # contiguous, in order
    assert sizes.sum() == total and (sizes > 0).all() and sizes.max() <= largest
    if parts > 1 and total >= min(smallest, largest):
        assert sizes.min() >= min(smallest, largest) // 2  # no crumb at the end
    if parts == 1:
        assert (sizes[:-1] == largest).all()  # one device: nothing to balance
    assert (np.diff(sizes) <= 0).sum() >= len(sizes) - 2  # never growing, but for the halves of the rest


def test_random_schedules_cover_every_item_once():
    rng = random.Random(44)
    for _ in range(300):
        total, parts = rng.randrange(0, 200_000), rng.randrange(1, 9)
        largest = rng.randrange(1, 20_000)
        smallest = rng.randrange(1, largest + 1)
        chunks = _drain(ChunkQueue(total, parts, largest, smallest))
        seen = np.zeros(total, np.int64)
        for s, c in chunks:
            seen[s : s + c] += 1
        assert (seen == 1).all() and all(0 < c <= largest for _, c in chunks)


def test_one_device_takes_chunks_of_the_largest_size_like_the_single_gpu_run():
    """With nothing to balance, the split on one GPU launches what iter_track does: 13 batches of
    8 M for the 102 M benchmark run, the last the rest."""
    sizes = [c for _, c in _drain(ChunkQueue(102_056_000, 1, 8_000_000, 1 << 20))]
    assert sizes == [8_000_000] * 12 + [6_056_000]


def test_four_devices_end_on_chunks_of_about_the_smallest_size():
    sizes = [c for _, c in _drain(ChunkQueue(102_056_000, 4, 8_000_000, 1 << 20))]
    assert sizes[:5] == [8_000_000] * 5  # big chunks first
    tail = sizes[-8:]
    assert all((1 << 19) <= c <= (1 << 20) + 1 for c in tail)  # the last round: no launches of a few streamlines
    assert len(sizes) < 30  # the 2^18 floor gave 39 chunks


def test_a_failed_devices_ranges_come_back_first_and_are_still_covered_once():
    q = ChunkQueue(10_000, 4, largest=1000, smallest=100)
    taken = [q.take() for _ in range(3)]
    q.give_back([taken[1]])
    rest = _drain(q)
    seen = np.zeros(10_000, np.int64)
    for s, c in [taken[0], taken[2], *rest]:
        seen[s : s + c] += 1
    assert rest[0] == taken[1] and (seen == 1).all()


def test_probabilistic_chunks_summed_in_any_order_equal_one_run():
    """Each streamline's random numbers depend only on its number, and the totals are integers:
    the chunks of a 3-device schedule, tracked in a shuffled order and added, give one run's
    counts to the last one (path distribution, waytotal, seed x target, seed matrix, steps)."""
    from tractlens.gpu.probabilistic_numpy import track_numpy
    from tractlens.gpu.probabilistic_split import sum_results

    from .test_multidevice import _assert_same, _split_case

    field_, bits, seeds, params = _split_case()
    total = len(seeds) * params.n_samples
    whole = track_numpy(field_, bits, seeds, params, 1, 1, seed_matrix=True)
    chunks = _drain(ChunkQueue(total, 3, largest=total // 5, smallest=total // 40))
    assert len(chunks) > 6
    random.Random(7).shuffle(chunks)
    parts = [track_numpy(field_, bits, seeds, params, 1, 1, s, c, seed_matrix=True) for s, c in chunks]
    _assert_same(sum_results(parts, field_.shape, len(seeds), 1), whole)
