"""The CPU engines of fiber selection (gpu/select_host.py: the compiled loop and NumPy in the
regions' box) give the NumPy reference's bits (gpu.select.hits_arrays on the whole grid's bit
volume), bit for bit, also on the cases where float32 rounding decides: points on voxel faces,
segments along boundary planes, long segments of many pieces, empty and one-point streamlines."""

import numpy as np
import pytest

from tractlens.gpu import host, select_host
from tractlens.gpu.backend import Cancelled
from tractlens.gpu.select import StreamlineIndex, hits_arrays, region_bits, select_streamlines

ENGINES = ("arrays", "compiled")
needs_numba = pytest.mark.skipif(
    not select_host.available(), reason="numba (the cpu extra) is not installed, or TRACTLENS_DISABLE_NUMBA is set"
)


def engine_param(engine):
    return pytest.param(engine, marks=needs_numba) if engine == "compiled" else engine


ENGINE_PARAMS = [engine_param(e) for e in ENGINES]


def reference_bits(points, offsets, masks):
    """The reference: the whole grid's bit volume, its box shortcut, all streamlines at once."""
    bits = region_bits(masks)
    occupied = np.argwhere(bits != 0)
    box = (occupied.min(axis=0), occupied.max(axis=0)) if len(occupied) else None
    return hits_arrays(np, points, offsets, bits, 0, len(offsets) - 1, box)


def tricky_case(rng, shape=(14, 12, 10), n=600):
    """Streamlines of 0 to 12 points: random walks, with coordinates snapped to voxel faces
    (k + 0.5), voxel centres and slightly off them; steps from 0 to several voxels (many pieces);
    some leave the grid on every side."""
    lines = []
    for _ in range(n):
        m = int(rng.integers(0, 13))
        start = rng.uniform(-2, np.array(shape) + 1, size=3)
        steps = rng.normal(scale=rng.choice([0.3, 1.0, 4.0]), size=(max(m - 1, 0), 3))
        line = np.vstack([start, start + np.cumsum(steps, axis=0)])[:m]
        snap = rng.uniform(size=line.shape)
        line = np.where(snap < 0.2, np.round(line) + 0.5, line)  # on a face
        line = np.where((snap >= 0.2) & (snap < 0.3), np.round(line), line)  # on a centre
        line = np.where((snap >= 0.3) & (snap < 0.35), np.round(line) + 0.5 + 1e-6, line)
        below_face = np.nextafter((np.round(line) + 0.5).astype(np.float32), np.float32(-np.inf))
        line = np.where((snap >= 0.35) & (snap < 0.45), below_face, line)  # x + 0.5 rounds up in float32
        if m > 1 and rng.uniform() < 0.1:
            line[1] = line[0]  # a segment of length 0
        lines.append(line.astype(np.float32))
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in lines])]).astype(np.int64)
    points = np.concatenate(lines).astype(np.float32) if offsets[-1] else np.zeros((0, 3), np.float32)
    return points, offsets


def masks_of(rng, shape, n, density):
    masks = [rng.uniform(size=shape) < density for _ in range(n)]
    masks[0][0, 0, 0] = masks[-1][-1, -1, -1] = True  # regions at the grid's corners too
    return masks


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
@pytest.mark.parametrize(("n_masks", "density"), [(1, 0.02), (3, 0.05), (32, 0.01)])
def test_cpu_engines_equal_the_reference_bit_for_bit(engine, n_masks, density, rng):
    shape = (14, 12, 10)
    points, offsets = tricky_case(rng, shape)
    masks = masks_of(rng, shape, n_masks, density)
    expected = reference_bits(points, offsets, masks)
    boxes = select_host.region_boxes(masks)
    for threads in (1, 3):
        got = select_host.streamline_bits(points, offsets, boxes, engine=engine, threads=threads, chunk_bytes=5000)
        np.testing.assert_array_equal(got, expected)
    assert 0.05 < (expected != 0).mean() < 0.95  # neither trivially empty nor full


def straight_lines(rng, n=2000, m=60):
    """``n`` straight streamlines of ``m`` points 0.9 voxel apart in a 120³ grid."""
    start = rng.uniform(20, 100, (n, 1, 3))
    direction = rng.normal(size=(n, 1, 3))
    direction /= np.linalg.norm(direction, axis=2, keepdims=True)
    points = (start + direction * np.arange(m)[None, :, None] * 0.9).reshape(-1, 3).astype(np.float32)
    return points, np.arange(0, n * m + 1, m, dtype=np.int64)


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_a_small_region_far_inside_a_large_grid(engine, rng):
    """The benchmark's shape: a 4³ region in a 120³ grid, long smooth streamlines through it;
    only the box is kept, and the bits are the reference's."""
    n = 2000
    points, offsets = straight_lines(rng, n)
    roi = np.zeros((120, 120, 120), bool)
    roi[58:62, 58:62, 58:62] = True
    expected = reference_bits(points, offsets, [roi])
    got = select_streamlines(points, offsets, [roi], device="cpu", engine=engine)
    np.testing.assert_array_equal(got.bits, expected)
    assert got.provenance["engine"] == engine
    assert 0 < got.selected.sum() < n


def test_region_boxes_hold_the_whole_grid_bits(rng):
    """Regions close together share a box, far apart ones keep their own; every voxel's bits,
    ORed over the boxes that hold it, are the whole grid's."""
    shape = (60, 40, 50)
    masks = [np.zeros(shape, bool) for _ in range(4)]
    masks[0][4:7, 3, 10] = True
    masks[1][5:8, 4:6, 11] = True  # beside masks[0]: one box
    masks[3][50:55, 30:35, 40:45] = True  # far away: a box of its own (masks[2] is empty)
    boxes = select_host.region_boxes(masks)
    assert len(boxes.starts) == 2
    whole = region_bits(masks)
    rebuilt = np.zeros(shape, np.uint32)
    for c in range(2):
        lo = boxes.boxes[c, :3].astype(int)
        hi = boxes.boxes[c, 3:6].astype(int)
        np.testing.assert_array_equal(boxes.boxes[c, 6:], np.concatenate([lo - 1, hi + 1]))
        rebuilt[lo[0] : hi[0] + 1, lo[1] : hi[1] + 1, lo[2] : hi[2] + 1] |= boxes.bits(c)
    np.testing.assert_array_equal(rebuilt, whole)
    assert boxes.flat.size < 200  # two small boxes, not one from (4, 3, 10) to (54, 34, 44)
    assert select_host.region_boxes([np.zeros((3, 3, 3), bool)]) is None


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_regions_far_apart_equal_the_reference(engine, rng):
    """Two ROIs at the two ends of the grid (two boxes), and 32 one-voxel regions scattered."""
    points, offsets = straight_lines(rng, 1500)
    ends = [np.zeros((120, 120, 120), bool) for _ in range(2)]
    ends[0][25:35, 25:35, 25:35] = True
    ends[1][85:95, 85:95, 85:95] = True
    scattered = [np.zeros((120, 120, 120), bool) for _ in range(32)]
    for mask in scattered:
        mask[tuple(rng.integers(20, 100, 3))] = True
    for masks in (ends, scattered):
        expected = reference_bits(points, offsets, masks)
        got = select_streamlines(points, offsets, masks[:1], masks[1:], device="cpu", engine=engine)
        np.testing.assert_array_equal(got.bits, expected)
        assert (expected != 0).any()


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_empty_regions_select_nothing(engine):
    points = np.array([[1, 1, 1], [2, 2, 2]], np.float32)
    sel = select_streamlines(points, np.array([0, 2]), [np.zeros((4, 4, 4), bool)], device="cpu", engine=engine)
    assert sel.bits.tolist() == [0] and sel.selected.tolist() == [False]


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_non_finite_points_count_nothing_and_break_nothing(engine):
    """A NaN or infinite point lies in no voxel; segments with such an end are not traversed (the
    reference drops NaN ones, and has no answer for infinite ones); the other points count."""
    roi = np.zeros((5, 5, 5), bool)
    roi[2, 2, 2] = True
    for bad in (np.nan, np.inf, -np.inf, 1e30):
        points = np.array([[1, 2, 2], [bad, 2, 2], [2, 2, 2], [bad, bad, bad], [3, 3, 3]], np.float32)
        got = select_streamlines(points, np.array([0, 2, 5]), [roi], device="cpu", engine=engine)
        assert got.bits.tolist() == [0, 1], bad
    nan_only = np.array([[1, 2, 2], [np.nan, 2, 2], [3, 2, 2]], np.float32)  # passes the region only by NaN
    with np.errstate(invalid="ignore"):  # the reference casts NaN voxels to integers
        expected = reference_bits(nan_only, np.array([0, 3]), [roi])
    got = select_streamlines(nan_only, np.array([0, 3]), [roi], device="cpu", engine=engine).bits
    np.testing.assert_array_equal(got, expected)


def test_auto_weighs_numbas_start_against_the_work(monkeypatch):
    monkeypatch.setattr(select_host, "compiled_started", lambda: False)
    assert select_host.engine_by_cost(5_000_000, 0.001, 1, 2) == "arrays"  # a small ROI
    assert select_host.engine_by_cost(5_000_000, 0.5, 1, 2) == "compiled"  # half the points near it
    assert select_host.engine_by_cost(5_000_000, 0.5, 1, 1000) == "arrays"
    assert select_host.engine_by_cost(10**10, 0.0, 1, 2) == "compiled"
    monkeypatch.setattr(select_host, "compiled_started", lambda: True)
    assert select_host.engine_by_cost(100, 0.0, 1, 16) == "compiled"


def test_auto_estimates_the_share_of_points_near_the_regions(monkeypatch, rng):
    points, _offsets = straight_lines(rng)
    small, large = np.zeros((120, 120, 120), bool), np.zeros((120, 120, 120), bool)
    small[58:62, 58:62, 58:62] = True
    large[10:110, 10:110, 10:110] = True
    shares = {}
    monkeypatch.setattr(select_host, "numba_installed", lambda: True)
    monkeypatch.setattr(select_host, "available", lambda: True)
    monkeypatch.setattr(select_host, "engine_by_cost", lambda n, share, boxes, threads: shares.setdefault(boxes, share))
    select_host.auto_engine(points, select_host.region_boxes([small]), 2)
    assert shares.pop(1) < 0.01
    select_host.auto_engine(points, select_host.region_boxes([large]), 2)
    exact = ((points >= 9) & (points <= 110)).all(axis=1).mean()  # the box ± 1, every point
    assert 0.5 < exact < 0.95 and shares.pop(1) == pytest.approx(exact, abs=0.03)
    monkeypatch.setattr(select_host, "numba_installed", lambda: False)
    assert select_host.auto_engine(points, select_host.region_boxes([large]), 2) == "arrays"


@needs_numba
def test_auto_runs_the_compiled_loop_once_numba_has_started(rng):
    points, offsets = tricky_case(rng)
    masks = masks_of(rng, (14, 12, 10), 2, 0.02)
    select_streamlines(points, offsets, masks[:1], device="cpu", engine="compiled")
    assert host.compiled_started()
    sel = select_streamlines(points, offsets, masks[:1], masks[1:], device="cpu")
    assert sel.provenance["engine"] == "compiled"
    np.testing.assert_array_equal(sel.bits, reference_bits(points, offsets, masks))


def test_the_compiled_engine_without_numba_is_refused(numba_disabled):
    points = np.array([[1, 1, 1], [2, 2, 2]], np.float32)
    roi = np.ones((4, 4, 4), bool)
    with pytest.raises(ValueError, match="numba"):
        select_streamlines(points, np.array([0, 2]), [roi], device="cpu", engine="compiled")
    assert select_streamlines(points, np.array([0, 2]), [roi], device="cpu").provenance["engine"] == "arrays"


@pytest.mark.parametrize("engine", ENGINE_PARAMS)
def test_blocks_report_progress_in_order_and_stop_when_cancelled(engine, rng):
    points, offsets = straight_lines(rng)  # 120 000 points: blocks of 1 000
    roi = np.zeros((120, 120, 120), bool)
    roi[50:70, 50:70, 50:70] = True
    index = StreamlineIndex(points, offsets, device="cpu", chunk_bytes=2000 * select_host.ARRAY_BYTES_PER_POINT)
    seen = []
    index.select([roi], engine=engine, progress=lambda done, total: seen.append((done, total)))
    assert len(seen) >= 4 and seen == sorted(seen) and seen[-1] == (2000, 2000)
    calls = iter([False, True])  # cancelled after the first block
    with pytest.raises(Cancelled):
        index.select([roi], engine=engine, cancelled=lambda: next(calls, True))
