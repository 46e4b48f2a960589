"""Display arrays of tractograms at whole-brain scale (issue 41): index ranges over one point
array, direction colours without a float copy of all points, points on another grid in chunks."""

import itertools

import numpy as np
import pytest

from tractlens.app import fiber_arrays
from tractlens.app.fiber_arrays import direction_colours, level_cells
from tractlens.app.fiber_cache import FiberArrayCache
from tractlens.app.model import Layer, Tractogram
from tractlens.app.pipelines import select as select_pipeline


def curvy(rng, n=300, lengths=(2, 40), affine=None):
    counts = rng.integers(*lengths, n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    steps = rng.normal(size=(int(offsets[-1]), 3)).astype(np.float32)
    points = np.cumsum(steps, axis=0).astype(np.float32) + 50
    affine = np.diag([1.25, 1.25, 1.25, 1.0]) if affine is None else affine
    return Tractogram(points, offsets, affine, (80, 80, 80), streamline_scalars={"w": rng.random(n)})


def reference_colours(world, offsets):
    """The per-point direction colour, computed the plain way over all world points."""
    tangent = np.zeros_like(world, dtype=np.float64)
    for a, b in itertools.pairwise(offsets):
        line = world[a:b].astype(np.float64)
        if len(line) > 1:
            d = np.diff(line, axis=0)
            tangent[a : b - 1] += d
            tangent[a + 1 : b] += d
    norm = np.linalg.norm(tangent, axis=1)
    return (np.abs(tangent) * (255.0 / np.where(norm > 0, norm, 1.0))[:, None] + 0.5).astype(np.uint8)


def test_direction_colours_follow_world_directions_chunk_by_chunk(rng, monkeypatch):
    rotation = np.array([[0.0, -1.25, 0.0], [1.25, 0.0, 0.0], [0.0, 0.0, 2.0]])  # voxel axes turned and scaled
    affine = np.eye(4)
    affine[:3, :3] = rotation
    tract = curvy(rng, affine=affine)
    expected = reference_colours(tract.points_world(), tract.offsets)
    monkeypatch.setattr(fiber_arrays, "COLOUR_CHUNK_POINTS", 37)  # chunk edges inside streamlines and at them
    rgba = direction_colours(tract.points, tract.offsets, rotation, rgba=True)
    assert rgba.dtype == np.uint8 and rgba.shape == (len(tract.points), 4) and (rgba[:, 3] == 255).all()
    assert np.abs(rgba[:, :3].astype(int) - expected).max() <= 1  # float32 against float64 rounding


def test_levels_are_index_ranges_over_the_tractograms_own_points(rng):
    tract = curvy(rng)
    layer = Layer("t", tract, "tractogram")
    arrays = FiberArrayCache().prepare(layer)
    assert arrays.points is tract.points  # no copy, no world copy: the actor carries the affine
    assert arrays.points.dtype == np.float32
    np.testing.assert_array_equal(arrays.affine, tract.affine)
    full = arrays.levels["full"]
    assert full.connectivity is None and full.streamlines is None  # the identity: nothing stored
    assert full.offsets.dtype == np.int32 and full.n_points == len(tract.points)
    np.testing.assert_array_equal(full.point_index(), np.arange(len(tract.points)))


def test_a_selection_is_the_selected_streamlines_point_ranges(rng):
    tract = curvy(rng)
    selected = rng.random(len(tract)) < 0.3
    cells = level_cells(tract.offsets, "full", selected)
    ids = np.flatnonzero(selected)
    np.testing.assert_array_equal(cells.streamlines, ids)
    expected = np.concatenate([np.arange(tract.offsets[i], tract.offsets[i + 1]) for i in ids])
    np.testing.assert_array_equal(cells.connectivity, expected)
    assert cells.connectivity.dtype == np.int32 and cells.offsets.dtype == np.int32
    np.testing.assert_array_equal(np.diff(cells.offsets), tract.lengths[ids])


def test_capped_levels_keep_whole_streamlines_within_their_budget(rng, monkeypatch):
    tract = curvy(rng, n=2000)
    monkeypatch.setitem(fiber_arrays.LEVELS, "software", (5000, False))
    cells = level_cells(tract.offsets, "software")
    assert cells.n_points <= 5000 + 40 and cells.n_streamlines < len(tract)
    for k, line in enumerate(cells.streamlines):  # whole streamlines, their own points in order
        part = cells.connectivity[cells.offsets[k] : cells.offsets[k + 1]]
        np.testing.assert_array_equal(part, np.arange(tract.offsets[line], tract.offsets[line + 1]))


def test_the_cache_keeps_a_selections_ranges_for_the_view(rng):
    tract = curvy(rng)
    layer = Layer("t", tract, "tractogram")
    cache = FiberArrayCache()
    selected = rng.random(len(tract)) < 0.5
    cache.prepare_selection(layer, selected)  # what the selection job does on its worker
    first = cache.cells(layer, "full", selected)
    assert cache.cells(layer, "full", selected) is first  # the view only reads it
    assert cache.cells(layer, "full", selected.copy()) is not first  # another selection: computed


def test_a_selection_seeded_with_its_ids_gives_the_cells_found_from_the_bools(rng):
    """The GPU's selection hands the cache the selected ids and counts it found beside the
    verdict; the views' cells from them are those the cache makes from the bools alone."""
    tract = curvy(rng, n=600)
    layer = Layer("t", tract, "tractogram")
    selected = rng.random(len(tract)) < 0.3
    ids = np.flatnonzero(selected)
    made, seeded = FiberArrayCache(), FiberArrayCache()
    seeded.seed_selection(layer, selected, ids.astype(np.int32), np.diff(tract.offsets)[ids])
    for level in fiber_arrays.LEVELS:
        a, b = made.cells(layer, level, selected), seeded.cells(layer, level, selected)
        np.testing.assert_array_equal(a.offsets, b.offsets)
        np.testing.assert_array_equal(a.point_index(), b.point_index())
        np.testing.assert_array_equal(a.streamline_ids(), b.streamline_ids())
    assert seeded._selections[layer][2].dtype == np.int64  # as flatnonzero makes them


def test_scalars_for_colouring_are_float32_and_per_streamline_stays_per_streamline(rng):
    tract = curvy(rng)
    tract.point_scalars["fa"] = rng.random(len(tract.points)).astype(np.float32)
    layer = Layer("t", tract, "tractogram")
    values, kind = fiber_arrays.scalar_values(layer, "fa")
    assert kind == "point" and values.dtype == np.float32 and np.shares_memory(values, tract.point_scalars["fa"])
    values, kind = fiber_arrays.scalar_values(layer, "w")
    assert kind == "streamline" and values.shape == (len(tract),) and values.dtype == np.float32


@pytest.mark.parametrize("same_grid", [True, False])
def test_points_on_the_selection_grid_without_a_float64_copy(rng, monkeypatch, same_grid):
    tract = curvy(rng)
    monkeypatch.setattr(select_pipeline, "GRID_CHUNK_POINTS", 101)
    grid = (
        tract.affine
        if same_grid
        else np.diag([2.0, 2.0, 2.0, 1.0]) @ np.array([[1, 0, 0, 3.0], [0, 1, 0, -1.0], [0, 0, 1, 2.0], [0, 0, 0, 1]])
    )
    points = select_pipeline.points_on_grid(tract, grid)
    assert points.dtype == np.float32
    if same_grid:
        assert points is tract.points
    else:
        np.testing.assert_allclose(points, tract.points_on(grid), rtol=0, atol=1e-4)


@pytest.mark.parametrize("color_by", ["direction", "w", "fa"])
def test_the_slice_views_colours_of_a_capped_level_are_those_of_its_points(rng, monkeypatch, color_by):
    tract = curvy(rng, n=2000)
    tract.point_scalars["fa"] = rng.random(len(tract.points)).astype(np.float32)
    monkeypatch.setitem(fiber_arrays.LEVELS, "software", (5000, False))  # slice views use this level
    layer = Layer("t", tract, "tractogram", color_by=color_by, colormap="viridis")
    layer.clim = (0.2, 0.8)
    cache = FiberArrayCache()
    points, colours, _offsets, streams = cache.on_reference(layer, tract.affine)
    level = cache.prepare(layer).levels["software"]
    assert level.streamlines is not None and len(colours) == len(points) == level.n_points
    every = fiber_arrays.fiber_point_colours(layer)  # all points, then the level's
    np.testing.assert_array_equal(colours, every[level.connectivity])
    np.testing.assert_array_equal(streams, np.repeat(level.streamlines, np.diff(level.offsets)))


def test_a_level_not_prepared_ahead_is_made_when_asked_for(rng, monkeypatch):
    tract = curvy(rng, n=2000)
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving", (5000, False))
    cache = FiberArrayCache()
    cache.skip_levels = frozenset({"moving"})  # what the 3-D view says with software OpenGL
    layer = Layer("t", tract, "tractogram")
    assert "moving" not in cache.prepare(layer).levels
    cells = cache.cells(layer, "moving")
    assert cache.cells(layer, "moving") is cells  # kept
    expected = level_cells(tract.offsets, "moving")
    np.testing.assert_array_equal(cells.connectivity, expected.connectivity)


def test_pieces_cover_every_streamline_once_within_their_point_budget(rng):
    tract = curvy(rng, n=500)
    offsets = tract.offsets
    bounds = fiber_arrays.piece_bounds(offsets, 2000)
    assert len(bounds) > 3 and bounds[0][0] == 0 and bounds[-1][1] == len(tract)
    assert all(b0 == a1 for (_a0, b0), (a1, _b1) in itertools.pairwise(bounds))
    assert all(offsets[b] - offsets[a] <= 2000 for a, b in bounds)  # at most: a GPU's limits hold
    assert fiber_arrays.piece_bounds(offsets, int(offsets[-1])) == [(0, len(tract))]


@pytest.mark.parametrize("built", ["by piece", "split"])
@pytest.mark.parametrize("level", ["full", "moving_software", "software", "selection"])
def test_cells_by_piece_are_the_levels_index_ranges_from_each_pieces_first_point(rng, monkeypatch, level, built):
    tract = curvy(rng, n=500)
    offsets = tract.offsets
    monkeypatch.setitem(fiber_arrays.LEVELS, "software", (3000, False))
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving_software", (1500, True))
    selected = rng.random(len(tract)) < 0.3 if level == "selection" else None
    bounds = fiber_arrays.piece_bounds(offsets, 2000)
    name = "full" if level == "selection" else level
    plain = level_cells(offsets, name, selected)  # over the whole array, as with one piece
    cells = level_cells(offsets, name, selected, bounds if built == "by piece" else None)
    parts = cells.pieces(offsets, bounds)
    assert len(parts) == len(bounds) and cells.pieces(offsets, bounds) is parts  # computed once
    streamlines, connectivity = [], []
    for (a, b), part in zip(bounds, parts, strict=True):
        index = part.point_index()
        assert index.min(initial=0) >= 0 and index.max(initial=-1) < offsets[b] - offsets[a]  # within the piece
        connectivity.append(index + offsets[a])
        ids = part.streamline_ids()
        streamlines.append(np.arange(len(tract))[ids] if isinstance(ids, slice) else ids)
        assert part.n_streamlines == len(streamlines[-1]) and part.total in (0, len(tract))
    np.testing.assert_array_equal(np.concatenate(connectivity), plain.point_index())
    np.testing.assert_array_equal(cells.point_index(), plain.point_index())  # joined when read
    np.testing.assert_array_equal(cells.offsets, plain.offsets)
    assert cells.n_points == plain.n_points
    whole = np.arange(len(tract)) if cells.streamlines is None else cells.streamlines
    np.testing.assert_array_equal(np.concatenate(streamlines), whole)


@pytest.mark.parametrize("step", [1, 3])
def test_index_ranges_written_by_threads_in_chunks_are_the_plain_ones(rng, monkeypatch, step):
    monkeypatch.setattr(fiber_arrays, "INDEX_CHUNK_POINTS", 97)
    monkeypatch.setattr(fiber_arrays, "INDEX_THREADS", 4)
    counts = rng.integers(0, 30, 400)
    new_offsets = np.concatenate([[0], np.cumsum(counts)])
    base = rng.integers(0, 10_000, 400).astype(np.int32)
    got = fiber_arrays.index_ranges(base, counts, new_offsets, step)
    expected = np.concatenate([base[k] + step * np.arange(new_offsets[k], new_offsets[k + 1]) for k in range(400)])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


def test_a_selection_prepares_only_the_levels_the_view_draws(rng):
    layer = Layer("t", curvy(rng), "tractogram")
    cache = FiberArrayCache()
    cache.skip_selection_levels = frozenset({"software", "moving_software"})  # what hardware OpenGL says
    selected = rng.random(len(layer.data)) < 0.5
    cache.prepare_selection(layer, selected)
    prepared = cache._selections[layer][1]
    assert set(prepared) == {"full", "moving"}
    assert cache.cells(layer, "software", selected).n_streamlines == selected.sum()  # made when asked for


def test_a_selection_within_a_levels_budget_shares_the_whole_selections_cells(rng, monkeypatch):
    layer = Layer("t", curvy(rng, n=400), "tractogram")
    cache = FiberArrayCache()
    selected = rng.random(len(layer.data)) < 0.2
    n_points = int(np.diff(layer.data.offsets)[selected].sum())
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving", (n_points, False))  # the selection fits the budget
    monkeypatch.setitem(fiber_arrays.LEVELS, "software", (n_points - 1, False))  # ... and not this one
    cache.prepare_selection(layer, selected)
    whole = cache.cells(layer, "full", selected)
    assert cache.cells(layer, "moving", selected) is whole  # made once
    capped = cache.cells(layer, "software", selected)
    assert capped is not whole and capped.n_points <= n_points - 1
    assert cache.cells(layer, "moving_software", selected) is whole  # within 60,000 points: nothing decimated


@pytest.mark.parametrize("level", ["full", "moving", "selection"])
def test_draw_ranges_are_each_pieces_streamlines_first_point_and_count(rng, monkeypatch, level):
    """What the 3-D view's own OpenGL buffers draw (glMultiDrawArrays): per piece, the first point
    (from the piece's first) and the point count of every streamline of the level, as int32;
    the same streamlines as the level's connectivity, with no connectivity made."""
    tract = curvy(rng, n=500)
    offsets = tract.offsets
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving", (3000, False))
    selected = rng.random(len(tract)) < 0.3 if level == "selection" else None
    name = "full" if level == "selection" else level
    bounds = fiber_arrays.piece_bounds(offsets, 2000)
    plain = level_cells(offsets, name, selected)
    cells = level_cells(offsets, name, selected, bounds, ranges_only=True)
    assert cells.stored is None  # nothing per point made
    ranges = cells.ranges(offsets, bounds)
    assert cells.ranges(offsets, bounds) is ranges and len(ranges) == len(bounds)  # computed once
    drawn = []
    for (a, _b), (first, count) in zip(bounds, ranges, strict=True):
        assert first.dtype == np.int32 and count.dtype == np.int32
        drawn += [np.arange(f, f + c) + offsets[a] for f, c in zip(first, count, strict=True)]
    np.testing.assert_array_equal(np.concatenate(drawn), plain.point_index())
    np.testing.assert_array_equal(cells.offsets, plain.offsets)
    np.testing.assert_array_equal(cells.connectivity if plain.connectivity is not None else None, plain.connectivity)


def test_a_decimated_level_is_not_drawn_as_ranges(rng, monkeypatch):
    tract = curvy(rng, n=500)
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving_software", (1500, True))
    cells = level_cells(tract.offsets, "moving_software", ranges_only=True)
    assert cells.decimated and cells.stored is not None  # every k-th point: indices as before
    with pytest.raises(ValueError, match="decimated"):
        cells.ranges(tract.offsets, [(0, len(tract))])


def test_a_shader_drawn_tractogram_gets_no_direction_colours_ahead(rng, monkeypatch):
    """A tractogram the 3-D view colours by direction in a shader: preparing it makes no RGBA per
    point and levels of ranges only; the slice views' direction colours are made for their
    level's points only, equal to those of all points."""
    tract = curvy(rng, n=2000)
    monkeypatch.setitem(fiber_arrays.LEVELS, "software", (5000, False))
    cache = FiberArrayCache()
    cache.shader_drawn_min_points = 1
    layer = Layer("t", tract, "tractogram")
    arrays = cache.prepare(layer)
    assert arrays.given_direction is None and arrays.ranges_only
    selected = rng.random(len(tract)) < 0.5
    cache.prepare_selection(layer, selected)
    assert cache.cells(layer, "full", selected).stored is None  # ranges only: no connectivity
    _points, colours, _offsets, _streams = cache.on_reference(layer, tract.affine)
    assert arrays.given_direction is None  # still none for all points
    level = cache.cells(layer, "software")
    every = fiber_arrays.fiber_point_colours(layer)
    np.testing.assert_array_equal(colours, every[level.connectivity])
    cache.shader_drawn_min_points = len(tract.points) + 1  # larger than this one: made as before
    other = Layer("u", tract, "tractogram")
    assert cache.prepare(other).given_direction is not None


def test_a_streamline_longer_than_a_piece_is_a_piece_of_its_own():
    offsets = np.concatenate([[0], np.cumsum([10, 10, 500, 10, 10])]).astype(np.int64)
    bounds = fiber_arrays.piece_bounds(offsets, 25)
    assert bounds == [(0, 2), (2, 3), (3, 5)]  # 20, 500 (alone), 20 points


def test_a_random_subset_is_sorted_distinct_reproducible_and_spread_over_the_range():
    from tractlens.app.fiber_arrays import BERNOULLI_FROM, random_subset

    for n, k in ((10_000_000, 240_000), (1_190_000, 240_000), (1_000, 999), (50, 50)):
        pick = random_subset(n, k)
        assert (k < BERNOULLI_FROM * n) == (n == 10_000_000)  # both ways of drawing are covered
        assert pick.dtype.kind == "i" and len(pick) == k
        assert (np.diff(pick) > 0).all() and pick[0] >= 0 and pick[-1] < n
        np.testing.assert_array_equal(pick, random_subset(n, k))  # the same subset each time
        if k < n:  # spread over the whole range, not bunched at one end
            counts = np.histogram(pick, bins=10, range=(0, n))[0]
            assert counts.min() > 0.9 * len(pick) / 10, counts


def test_a_selections_moving_level_is_every_kth_of_its_whole_level_with_the_ranges_sliced(rng, monkeypatch):
    """A selection's level while the camera moves is sliced from its whole level on the
    selection's worker (every k-th streamline, and each piece's index ranges), not a random
    subset drawn and gathered again: the same ranges as made afresh for those streamlines,
    across the pieces of the point array, within the level's budget."""
    monkeypatch.setattr(fiber_arrays, "PIECE_POINTS", 3000)  # several pieces
    tract = curvy(rng, n=2000)
    cache = FiberArrayCache()
    cache.shader_drawn_min_points = 1
    layer = Layer("t", tract, "tractogram")
    arrays = cache.prepare(layer)
    assert len(arrays.bounds) > 3
    selected = rng.random(len(tract)) < 0.5
    ids = np.flatnonzero(selected)
    lengths = np.diff(np.asarray(tract.offsets))[ids]
    budget = int(lengths.sum()) // 5
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving", (budget, False))
    cache.prepare_selection(layer, selected)
    moving = cache.cells(layer, "moving", selected)
    assert moving is not cache.cells(layer, "full", selected)
    step = int(np.ceil(len(ids) / int(budget / (lengths.sum() / len(ids)))))
    np.testing.assert_array_equal(moving.streamlines, ids[::step])
    assert 0.8 * budget <= moving.n_points <= 1.2 * budget
    fresh = fiber_arrays.streamline_cells(arrays.offsets, ids[::step], ranges_only=True)
    np.testing.assert_array_equal(moving.offsets, fresh.offsets)
    sliced = moving._ranges[1]  # made on the worker, sliced from the whole level's
    for (starts, counts), (want_starts, want_counts) in zip(
        sliced, fresh.ranges(arrays.offsets, arrays.bounds), strict=True
    ):
        np.testing.assert_array_equal(starts, want_starts)
        np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_array_equal(moving.connectivity, fresh.connectivity)  # made when read, as any


def _ranges_equal(a, b, arrays) -> None:
    for (starts, counts), (want_starts, want_counts) in zip(
        a.ranges(arrays.offsets, arrays.bounds), b.ranges(arrays.offsets, arrays.bounds), strict=True
    ):
        np.testing.assert_array_equal(starts, want_starts)
        np.testing.assert_array_equal(counts, want_counts)


def test_a_selections_later_level_is_made_on_its_thread_after_the_first_and_waited_for(rng, monkeypatch):
    """What an ROI edit on a whole-brain tractogram does: the selection job makes the moving
    level the edit's frame draws (every k-th selected streamline, from the ids: the same cells as
    sliced from the whole level), and the full level, drawn once the edits pause, after it on the
    later thread; a view that asks for it first waits for it. A selection replaced meanwhile
    (the next edit) makes no full level of its own."""
    import threading

    from tractlens.app import fiber_cache

    monkeypatch.setattr(fiber_arrays, "PIECE_POINTS", 3000)  # several pieces
    tract = curvy(rng, n=2000)
    layer = Layer("t", tract, "tractogram")
    caches = {}
    for later in (frozenset(), frozenset({"full"})):
        caches[later] = cache = FiberArrayCache()
        cache.shader_drawn_min_points = 1
        cache.skip_selection_levels = frozenset({"software", "moving_software"})
        cache.later_selection_levels = later
    arrays = caches[frozenset()].prepare(layer)
    assert len(arrays.bounds) > 3
    selected = rng.random(len(tract)) < 0.5
    budget = int(np.diff(np.asarray(tract.offsets))[selected].sum()) // 5
    monkeypatch.setitem(fiber_arrays.LEVELS, "moving", (budget, False))
    now, later = caches[frozenset()], caches[frozenset({"full"})]
    now.prepare_selection(layer, selected)

    gate = threading.Event()  # the later thread held, so that what it has not made yet is seen
    fiber_cache._later_thread().submit(gate.wait, 30)
    later.prepare_selection(layer, selected)
    pending = later._selections[layer][1]["full"]
    assert not pending.done()
    moving = later.cells(layer, "moving", selected)  # made by the job, before the full level
    _ranges_equal(moving, now.cells(layer, "moving", selected), arrays)  # (sliced from the whole level there)
    np.testing.assert_array_equal(moving.streamlines, now.cells(layer, "moving", selected).streamlines)
    replaced = selected.copy()  # the next edit's selection, before the later thread came to the first's
    later.prepare_selection(layer, replaced)
    gate.set()
    assert pending.result(30) is None  # the first selection's: given up
    full = later.cells(layer, "full", replaced)  # waited for, made on the later thread
    assert later._selections[layer][1]["full"] is full
    _ranges_equal(full, now.cells(layer, "full", selected), arrays)
    np.testing.assert_array_equal(full.streamlines, np.flatnonzero(selected))


def test_a_selections_ranges_from_the_first_points_found_beside_it_equal_those_gathered(rng, monkeypatch):
    """A selection found on the GPU comes with each streamline's first point: the index ranges
    start from them, without gathering the tractogram's offsets again; the same ranges."""
    monkeypatch.setattr(fiber_arrays, "PIECE_POINTS", 3000)  # several pieces
    tract = curvy(rng, n=2000)
    offsets = np.asarray(tract.offsets)
    selected = rng.random(len(tract)) < 0.4
    ids = np.flatnonzero(selected)
    ranges = {}
    for given in (True, False):
        cache = FiberArrayCache()
        cache.shader_drawn_min_points = 1
        layer = Layer("t", tract, "tractogram")
        arrays = cache.prepare(layer)
        if given:  # as select_fibres does with the GPU's answer (first points off by one would show)
            cache.seed_selection(layer, selected, ids, offsets[ids + 1] - offsets[ids], offsets[ids])
        cache.prepare_selection(layer, selected)
        ranges[given] = cache.cells(layer, "full", selected).ranges(arrays.offsets, arrays.bounds)
    fresh = fiber_arrays.streamline_cells(offsets, ids, ranges_only=True).ranges(arrays.offsets, arrays.bounds)
    assert len(fresh) > 3
    for got in ranges.values():
        for (starts, counts), (want_starts, want_counts) in zip(got, fresh, strict=True):
            np.testing.assert_array_equal(starts, want_starts)
            np.testing.assert_array_equal(counts, want_counts)


def test_index_work_runs_on_kept_threads_and_a_call_from_one_of_them_runs_in_place(monkeypatch):
    """The index ranges are written on threads kept between calls (a pool made and joined per
    call joined threads on the ROI edit's worker); work asked for from one of those threads runs
    there, so that no pool waits on itself."""
    import threading

    monkeypatch.setattr(fiber_arrays, "INDEX_THREADS", 4)  # several, whatever this machine has
    names = fiber_arrays.index_map(lambda _: threading.current_thread().name, list(range(8)))
    assert all(name.startswith(fiber_arrays.INDEX_THREAD_PREFIX) for name in names)
    after_first = threading.active_count()
    assert fiber_arrays.index_map(lambda k: k * k, list(range(8))) == [k * k for k in range(8)]  # in order
    assert threading.active_count() == after_first  # the same threads, none made again

    def inner(_):
        outer = threading.current_thread().name
        return outer, fiber_arrays.index_map(lambda __: threading.current_thread().name, [0, 1, 2])

    for outer, inside in fiber_arrays.index_map(inner, list(range(6))):
        assert inside == [outer] * 3
