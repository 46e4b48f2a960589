"""ROI selection against an exact brute-force reference (segment-box clipping)."""

import itertools

import numpy as np
import pytest

from tractlens.gpu.select import region_bits, select_streamlines


def segment_hits_box(p, q, voxel):
    """Exact: does segment p-q pass through the open cube voxel ± 0.5 (Liang-Barsky clipping)?"""
    t_enter, t_exit = 0.0, 1.0
    for axis in range(3):
        d = q[axis] - p[axis]
        lo, hi = voxel[axis] - 0.5, voxel[axis] + 0.5
        if d == 0:
            if not (lo < p[axis] < hi):
                return False
            continue
        t0, t1 = (lo - p[axis]) / d, (hi - p[axis]) / d
        t_enter, t_exit = max(t_enter, min(t0, t1)), min(t_exit, max(t0, t1))
    return t_enter < t_exit


def brute_force_bits(streamlines, masks):
    bits = region_bits(masks)
    shape = np.array(bits.shape)
    out = []
    for line in streamlines:
        value = 0
        for point in line:
            v = np.floor(point + 0.5).astype(int)
            if np.all(v >= 0) and np.all(v < shape):
                value |= int(bits[tuple(v)])
        for p, q in itertools.pairwise(line):
            lo = np.maximum(np.floor(np.minimum(p, q) + 0.5).astype(int), 0)
            hi = np.minimum(np.floor(np.maximum(p, q) + 0.5).astype(int), shape - 1)
            for i in range(lo[0], hi[0] + 1):
                for j in range(lo[1], hi[1] + 1):
                    for k in range(lo[2], hi[2] + 1):
                        if bits[i, j, k] and segment_hits_box(p, q, (i, j, k)):
                            value |= int(bits[i, j, k])
        out.append(value)
    return np.array(out, dtype=np.uint32)


def random_case(rng, n_streamlines=300, shape=(12, 10, 8), n_masks=4):
    lines = []
    for _ in range(n_streamlines):
        n = int(rng.integers(1, 15))
        start = rng.uniform(-1, np.array(shape), size=3)
        steps = rng.normal(scale=1.2, size=(n - 1, 3))  # segments up to a few voxels long
        lines.append(np.vstack([start, start + np.cumsum(steps, axis=0)]).astype(np.float32))
    masks = [rng.uniform(size=shape) < 0.03 for _ in range(n_masks)]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in lines])])
    return lines, np.concatenate(lines), offsets, masks


def test_bits_equal_the_exact_brute_force_reference(device, rng):
    lines, points, offsets, masks = random_case(rng)
    expected = brute_force_bits(lines, masks)
    got = select_streamlines(points, offsets, masks[:2], masks[2:], device=device).bits
    np.testing.assert_array_equal(got, expected)
    assert (expected != 0).mean() > 0.2  # the case is not trivially empty


def test_a_segment_crossing_a_voxel_without_a_point_in_it_passes(device):
    roi = np.zeros((4, 4, 2), bool)
    roi[1, 0, 0] = True
    points = np.array([[0, 0, 0], [2, 0, 0]], np.float32)  # no point in voxel (1, 0, 0)
    assert select_streamlines(points, np.array([0, 2]), [roi], device=device).selected.tolist() == [True]
    corner = np.zeros((4, 4, 2), bool)
    corner[1, 1, 0] = True
    clip = np.array([[0.4, 0.0, 0], [1.0, 0.7, 0]], np.float32)  # clips voxel (1, 1, 0) near its corner
    assert select_streamlines(clip, np.array([0, 2]), [corner], device=device).selected.tolist() == [True]
    miss = np.array([[0.4, 0.0, 0], [0.9, 0.45, 0]], np.float32)
    assert select_streamlines(miss, np.array([0, 2]), [corner], device=device).selected.tolist() == [False]


def test_include_is_and_exclude_is_not(device):
    a = np.zeros((10, 3, 3), bool)
    b = np.zeros((10, 3, 3), bool)
    x = np.zeros((10, 3, 3), bool)
    a[1, 1, 1] = b[8, 1, 1] = x[5, 1, 1] = True
    through_all = np.array([[0, 1, 1], [9, 1, 1]], np.float32)
    a_only = np.array([[0, 1, 1], [3, 1, 1]], np.float32)
    around_x = np.array([[0, 1, 1], [4, 1, 1], [4, 2.4, 1], [6, 2.4, 1], [6, 1, 1], [9, 1, 1]], np.float32)
    points = np.vstack([through_all, a_only, around_x])
    offsets = np.array([0, 2, 4, 10])
    sel = select_streamlines(points, offsets, [a, b], [x], device=device)
    assert sel.selected.tolist() == [False, False, True]
    assert sel.passes(0).tolist() == [True, True, True] and sel.passes(2).tolist() == [True, False, False]


def test_region_limits():
    with pytest.raises(ValueError, match="at most 32"):
        region_bits([np.zeros((2, 2, 2), bool)] * 33)
    with pytest.raises(ValueError, match="shape"):
        region_bits([np.zeros((2, 2, 2), bool), np.zeros((3, 2, 2), bool)])


def test_the_region_bits_of_the_regions_box_alone_are_those_of_the_whole_grid(rng):
    """What the GPU's selection uploads: the box's part of the bits, the rest zeros made there."""
    from tractlens.gpu.select import device_region_bits
    from tractlens.gpu.select_host import region_bounds

    masks = [np.zeros((30, 20, 25), bool) for _ in range(3)]
    masks[0][4:9, 3:5, 10:12] = True
    masks[1][12, 15, 20] = True  # apart from the first: one box holds both
    # the third is empty
    box = region_bounds(masks)
    whole = region_bits(masks)
    inside = region_bits(masks, box)
    assert inside.shape == (9, 13, 11)
    np.testing.assert_array_equal(inside, whole[4:13, 3:16, 10:21])
    np.testing.assert_array_equal(device_region_bits(np, masks, box), whole)  # NumPy standing in for CuPy
    assert whole.sum() == inside.sum() > 0


@pytest.mark.gpu
def test_gpu_kernel_equals_the_numpy_reference_on_a_large_case(rng):
    n = 20_000
    lengths = rng.integers(1, 60, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    starts = np.repeat(rng.uniform(0, 40, (n, 3)), lengths, axis=0)
    walk = rng.normal(scale=0.8, size=(offsets[-1], 3))
    points = (
        starts + np.cumsum(walk, axis=0) - np.repeat(np.cumsum(walk, axis=0)[offsets[:-1]], lengths, axis=0)
    ).astype(np.float32)
    masks = [rng.uniform(size=(40, 40, 40)) < 0.002 for _ in range(5)]
    cpu = select_streamlines(points, offsets, masks[:3], masks[3:], device="cpu")
    gpu = select_streamlines(points, offsets, masks[:3], masks[3:], device="gpu")
    arrays_gpu = select_streamlines(points, offsets, masks[:3], masks[3:], device="gpu", engine="arrays")
    assert gpu.provenance["engine"] == "kernel"
    np.testing.assert_array_equal(gpu.bits, cpu.bits)
    np.testing.assert_array_equal(arrays_gpu.bits, cpu.bits)
    np.testing.assert_array_equal(gpu.selected, cpu.selected)
    # the kernel's selection also gives the selected ids and their point counts, found on the GPU
    assert cpu.ids is None and gpu.ids is not None
    np.testing.assert_array_equal(gpu.ids, np.flatnonzero(cpu.selected))
    np.testing.assert_array_equal(gpu.lengths, lengths[cpu.selected])
    np.testing.assert_array_equal(gpu.starts, offsets[:-1][cpu.selected])  # each one's first point
    assert gpu.provenance["selected"] == cpu.provenance["selected"] == int(cpu.selected.sum()) > 0
    assert isinstance(gpu.selected, np.ndarray)
    again = select_streamlines(points, offsets, masks[:3], masks[3:], device="gpu")
    assert not isinstance(again.region_bits, np.ndarray)  # on the device until read ...
    assert isinstance(again.bits, np.ndarray) and again.bits is again.region_bits  # ... then once on the host
    np.testing.assert_array_equal(again.passes(1), (cpu.bits >> 1) & 1 == 1)


@pytest.mark.gpu
def test_gpu_kernel_skips_points_away_from_small_regions_and_stays_exact(rng):
    """The kernel looks nothing up for a point whose segment stays outside the regions' box (most
    of a whole-brain tractogram, for an ROI): the same bits as the NumPy reference, with long
    segments that jump across the box from outside it, and none at all for empty regions."""
    n = 20_000
    lengths = rng.integers(1, 40, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    starts = np.repeat(rng.uniform(0, 40, (n, 3)), lengths, axis=0)
    walk = rng.normal(scale=2.5, size=(offsets[-1], 3))  # segments of several voxels
    points = (
        starts + np.cumsum(walk, axis=0) - np.repeat(np.cumsum(walk, axis=0)[offsets[:-1]], lengths, axis=0)
    ).astype(np.float32)
    blob = np.zeros((40, 40, 40), bool)
    blob[18:21, 17:20, 19:22] = True
    spot = np.zeros_like(blob)
    spot[5, 30, 7] = True
    cpu = select_streamlines(points, offsets, [blob], [spot], device="cpu")
    gpu = select_streamlines(points, offsets, [blob], [spot], device="gpu")
    assert gpu.provenance["engine"] == "kernel"
    np.testing.assert_array_equal(gpu.bits, cpu.bits)
    assert 0 < (cpu.bits & 1).sum() < n // 10 and (cpu.bits & 2).sum() > 0
    empty = select_streamlines(points, offsets, [np.zeros_like(blob)], [], device="gpu")
    assert not empty.bits.any() and not empty.selected.any()


def test_small_regions_use_the_bounding_box_shortcut_and_stay_exact(device, rng):
    lines, points, offsets, _ = random_case(rng, n_streamlines=400, shape=(16, 16, 10))
    blob = np.zeros((16, 16, 10), bool)
    blob[6:9, 7:9, 4:6] = True
    other = np.zeros_like(blob)
    other[2, 3, 1] = True
    expected = brute_force_bits(lines, [blob, other])
    got = select_streamlines(points, offsets, [blob], [other], device=device).bits
    np.testing.assert_array_equal(got, expected)
    assert 0 < (expected & 1).sum() < len(lines)


def test_an_index_answers_repeated_selections_like_fresh_ones(device, rng):
    from tractlens.gpu.select import StreamlineIndex

    _lines, points, offsets, masks = random_case(rng, n_streamlines=200)
    index = StreamlineIndex(points, offsets, device=device)
    for include, exclude in (([masks[0]], []), ([masks[1], masks[2]], [masks[3]]), ([masks[3]], [masks[0]])):
        again = index.select(include, exclude)
        fresh = select_streamlines(points, offsets, include, exclude, device="cpu")
        np.testing.assert_array_equal(again.bits, fresh.bits)
        np.testing.assert_array_equal(again.selected, fresh.selected)


def test_selections_in_small_chunks_equal_those_in_one(device, rng):
    """The index's upload and streamline ids in blocks of a few points, and selections in
    batches of a few streamlines (a bounded working memory), give the bits of the whole at once."""
    from tractlens.gpu.select import StreamlineIndex

    _lines, points, offsets, masks = random_case(rng, n_streamlines=400)
    whole = StreamlineIndex(points, offsets, device=device, chunk_points=1 << 30, chunk_bytes=1 << 40)
    small = StreamlineIndex(points, offsets, device=device, chunk_points=37, chunk_bytes=6000)
    if small.backend.is_gpu:
        np.testing.assert_array_equal(small.backend.to_host(small.stream_of_point),
                                      small.backend.to_host(whole.stream_of_point))  # fmt: skip
    for engine in ("auto", "arrays"):
        batches = []
        for include, exclude in (([masks[0]], []), ([masks[1], masks[2]], [masks[3]])):
            one = whole.select(include, exclude, engine=engine)
            got = small.select(
                include, exclude, engine=engine, progress=lambda done, total, seen=batches: seen.append(done)
            )
            np.testing.assert_array_equal(got.bits, one.bits)
            np.testing.assert_array_equal(got.selected, one.selected)
            np.testing.assert_array_equal(got.bits, brute_force_bits(_lines, [*include, *exclude]))
        if engine == "arrays" or not small.backend.is_gpu:
            assert len(batches) > 10  # several chunks (600 B a point: 6000 B is one streamline or two)


def test_an_index_reads_points_given_as_row_slices(device, rng):
    """A source read by row slices (a tractogram converted as it is read) gives the same index."""
    from tractlens.gpu.select import StreamlineIndex, point_blocks

    _lines, points, offsets, masks = random_case(rng, n_streamlines=150)

    class Rows:
        def __len__(self):
            return len(points)

        def __getitem__(self, rows):
            return points[rows].copy()

    index = StreamlineIndex(Rows(), offsets, device=device, chunk_points=50)
    got = index.select([masks[0]], [masks[1]])
    expected = select_streamlines(points, offsets, [masks[0]], [masks[1]], device="cpu")
    np.testing.assert_array_equal(got.bits, expected.bits)
    blocks = point_blocks(offsets, 50)
    assert blocks[0][0] == 0 and blocks[-1][1] == len(offsets) - 1
    assert all(b0 == a1 for (_a0, b0), (a1, _b1) in itertools.pairwise(blocks))


def test_a_selection_working_memory_is_bounded_by_the_chunk(rng):
    """On the CPU the batches' temporaries stay near ``chunk_bytes`` per thread, whatever the
    free memory: not a fraction of the machine's memory. Measured on the NumPy engine (the
    compiled loop makes no temporaries: checked below)."""
    import tracemalloc

    from tractlens.gpu.host import host_threads
    from tractlens.gpu.select import StreamlineIndex

    n, length = 6000, 30
    start = rng.uniform(0, 40, (n, 1, 3)).astype(np.float32)
    points = (start + rng.normal(scale=0.7, size=(n, length, 3)).cumsum(axis=1).astype(np.float32)).reshape(-1, 3)
    offsets = np.arange(0, n * length + 1, length)
    mask = np.zeros((48, 48, 48), bool)
    mask[10:40, 10:40, 10:40] = True  # a large region: most segments are traversed
    peaks = {}
    for chunk in (1 << 20, 1 << 40):
        index = StreamlineIndex(points, offsets, device="cpu", chunk_bytes=chunk)
        tracemalloc.start()
        try:
            bits = index.select([mask], engine="arrays").bits
            peaks[chunk] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        peaks[f"bits{chunk}"] = bits
    np.testing.assert_array_equal(peaks["bits1048576"], peaks[f"bits{1 << 40}"])
    threads = host_threads()
    assert peaks[1 << 20] < threads * 3 * (1 << 20) + 2e6, peaks  # a few chunks' worth, the result
    assert peaks[1 << 40] > 4 * peaks[1 << 20], peaks  # the same selection unchunked: all at once
    from tractlens.gpu import select_host

    if select_host.available():
        index = StreamlineIndex(points, offsets, device="cpu", chunk_bytes=1 << 40)
        index.select([mask], engine="compiled")  # numba's start, outside the measurement
        tracemalloc.start()
        try:
            bits = index.select([mask], engine="compiled").bits
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        np.testing.assert_array_equal(bits, peaks["bits1048576"])
        assert peak < 4 * len(offsets) + 30**3 * 4 + 2e6, peak  # the result and the region's box


def test_the_gpu_index_uploads_rows_made_on_threads_in_order(monkeypatch):
    """StreamlineIndex._upload (the GPU index) makes the rows of a points object that converts as
    it is read on several host threads, a block ahead, and puts them up in order: here with NumPy
    standing in for the device, blocks of 7 points and 3 threads."""
    import threading
    import types

    from tractlens.gpu import select as select_module
    from tractlens.gpu import transfer

    rng = np.random.default_rng(4)
    voxels = rng.random((100, 3)).astype(np.float64) * 50
    threads = set()

    class Converting:  # a tractogram's points: rows made (to float32) as they are read
        def __len__(self):
            return len(voxels)

        def __getitem__(self, rows):
            threads.add(threading.get_ident())
            return voxels[rows].astype(np.float32)

    monkeypatch.setattr(transfer, "to_device", lambda block: np.array(block))
    monkeypatch.setattr(select_module, "UPLOAD_BLOCK_POINTS", 7)
    monkeypatch.setattr(select_module, "UPLOAD_THREADS", 3)
    monkeypatch.setattr(select_module, "host_threads", lambda: 8)
    index = types.SimpleNamespace(backend=types.SimpleNamespace(xp=np), chunk_points=1 << 24)
    up = select_module.StreamlineIndex._upload(index, Converting())
    np.testing.assert_array_equal(up, voxels.astype(np.float32))
    assert threads and threading.get_ident() not in threads  # made on the pool's threads, not the caller's
    index.chunk_points = 5  # the index's own chunk bounds the block too
    np.testing.assert_array_equal(select_module.StreamlineIndex._upload(index, Converting()), voxels.astype(np.float32))
