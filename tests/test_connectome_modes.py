"""probtrackx2's connectome modes (--omatrix2, --omatrix3, --network, --pd, --ompl,
--distthresh): each mode against brute-force counting over the same streamlines (a Python
loop over the steps the tracker took), the files parsed back with NumPy/SciPy, and the layout
checked with fslpy's probtrackx file tree."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from tests.test_probabilistic import SHAPE, straight_bundle
from tractlens.gpu.connectome import ConnectomeSpec, track_connectome
from tractlens.gpu.probabilistic_params import BIT_EXCLUDE, WAYPOINT_SHIFT, ProbParams, mask_bits, streamline_ids

PARAMS = ProbParams(n_samples=12, n_steps=120, seed=3)


def traced(device, field_, bits, seeds, params, n_waypoints=0):
    """Every streamline's steps (n, 2, T, 4), as the device's tracker takes them."""
    n = len(seeds) * params.n_samples
    if device == "gpu":
        from tractlens.gpu.backend import get_backend
        from tractlens.gpu.probabilistic_kernel import track_kernel

        _, trace = track_kernel(get_backend("gpu"), field_, bits, seeds, params, 0, n_waypoints, trace=True)
        return trace
    from tractlens.gpu.connectome import _trace_host

    return _trace_host(field_, bits, seeds, params, n_waypoints, 0, n)


def brute_visits(trace, step_mm):
    """Per streamline: {voxel: signed distance (mm) of its first visit}, in a plain loop, and its length."""
    out, lengths = [], []
    for steps in trace:
        first: dict[tuple, float] = {}
        total = 0
        for half, sign in ((0, 1.0), (1, -1.0)):
            moves, previous = 0, None
            for t, p in enumerate(steps[half, :, :3]):
                if t > 0 and np.array_equal(p, previous):
                    continue
                if t > 0:
                    moves += 1
                previous = p
                v = tuple(int(c) for c in np.rint(p))
                if all(0 <= c < s for c, s in zip(v, SHAPE, strict=True)) and v not in first:
                    first[v] = sign * moves * step_mm
            total += moves
        out.append(first)
        lengths.append(total * step_mm)
    return out, lengths


def brute_kept(visits, lengths, bits, n_waypoints=0, distthresh=0.0):
    kept = []
    for first, length in zip(visits, lengths, strict=True):
        hits = 0
        for v in first:
            hits |= int(bits[v])
        ok = not hits & BIT_EXCLUDE and length >= distthresh
        for i in range(n_waypoints):
            ok &= bool(hits >> (WAYPOINT_SHIFT + i) & 1)
        kept.append(ok)
    return kept


def as_dict(counts, lengths=False):
    values = counts.lengths_mm if lengths else counts.counts
    return {(int(r), int(c)): v for r, c, v in zip(counts.rows, counts.cols, values, strict=True)}


def phantom():
    field_, brain, bundle = straight_bundle()
    seeds = np.argwhere(bundle & (np.arange(SHAPE[0]) == 5)[:, None, None])[::2]
    return field_, brain, bundle, seeds


def numbered(mask):
    nodes = np.full(mask.shape, -1, dtype=np.int64)
    nodes[mask] = np.arange(int(mask.sum()))
    return nodes


def test_matrix2_counts_each_low_res_voxel_once_per_streamline(device):
    field_, brain, _, seeds = phantom()
    bits = mask_bits(brain)
    columns = np.full(SHAPE, -1, dtype=np.int64)
    columns[1:-1] = (np.arange(1, SHAPE[0] - 1) // 3)[:, None, None]  # 3-voxel thick slabs along x
    n_cols = int(columns.max()) + 1
    spec = ConnectomeSpec(matrix2_columns=columns, n_matrix2_columns=n_cols)
    result = track_connectome(
        field_, bits, seeds, PARAMS, spec, distthresh=0.0, distthresh3=0.0, lengths=True, device=device, chunk=37
    )
    visits, lengths = brute_visits(traced(device, field_, bits, seeds, PARAMS), PARAMS.step_mm)
    kept = brute_kept(visits, lengths, bits)
    _, seed_of = streamline_ids(0, len(visits), len(seeds), PARAMS.n_samples)
    counts, dist = defaultdict(int), defaultdict(float)
    for first, k, row in zip(visits, kept, seed_of, strict=True):
        if not k:
            continue
        seen = {}
        for v, d in sorted(first.items(), key=lambda item: (item[1] < 0, abs(item[1]))):
            seen.setdefault(columns[v], abs(d))
        for col, d in seen.items():
            if col >= 0:
                counts[(int(row), int(col))] += 1
                dist[(int(row), int(col))] += d
    assert result.matrix2.shape == (len(seeds), n_cols)
    assert as_dict(result.matrix2) == dict(counts)
    got = as_dict(result.matrix2, lengths=True)
    assert got.keys() == dist.keys() and all(abs(got[k] - dist[k]) < 1e-9 for k in dist)
    assert result.waytotal[0] == sum(kept) and result.streamlines == len(visits)
    print(f"\n[{device}] matrix2: {result.matrix2.nnz} non-zeros, {result.matrix2.counts.sum()} counts")


def test_the_path_distribution_is_the_trackers(device):
    """The visits the modes count from are the ones the tracker counts in fdt_paths."""
    from tests.test_probabilistic import run

    field_, brain, _, seeds = phantom()
    bits = mask_bits(brain, stop=np.isin(np.arange(SHAPE[0]), [20])[:, None, None] & brain)
    spec = ConnectomeSpec()
    result = track_connectome(
        field_, bits, seeds, PARAMS, spec, distthresh=0.0, distthresh3=0.0, lengths=False, device=device, chunk=50
    )
    reference = run(device, field_, bits, seeds, PARAMS)
    assert np.array_equal(result.paths, reference.paths) and result.waytotal[0] == reference.waytotal


@pytest.mark.parametrize("lowres", [False, True])
def test_matrix3_counts_every_pair_of_mask_voxels_a_streamline_joins(device, lowres):
    field_, brain, bundle, seeds = phantom()
    bits = mask_bits(brain)
    mask3 = bundle & np.isin(np.arange(SHAPE[0]), [2, 3, 14, 25, 26])[:, None, None]
    nodes = numbered(mask3)
    spec = ConnectomeSpec(matrix3_nodes=nodes, n_matrix3_nodes=int(mask3.sum()))
    lr = None
    if lowres:
        lr = np.full(SHAPE, -1, dtype=np.int64)
        lr[20:] = 0
        lr[:8] = 1
        spec.matrix3_columns, spec.n_matrix3_columns = lr, 2
    result = track_connectome(
        field_, bits, seeds, PARAMS, spec, distthresh=0.0, distthresh3=30.0, lengths=True, device=device, chunk=29,
        capacity=64, device_entries=100,  # many reductions, spills to the host and range merges
    )  # fmt: skip
    visits, lengths = brute_visits(traced(device, field_, bits, seeds, PARAMS), PARAMS.step_mm)
    kept = brute_kept(visits, lengths, bits)
    counts, dist = defaultdict(int), defaultdict(float)
    for first, k, length in zip(visits, kept, lengths, strict=True):
        if not k or length < 30.0:
            continue
        inside = [(int(nodes[v]), d) for v, d in first.items() if nodes[v] >= 0]
        if lowres:
            cols = {}
            for v, d in sorted(first.items(), key=lambda item: (item[1] < 0, abs(item[1]))):
                cols.setdefault(int(lr[v]), d)
            pairs = [((a, c), abs(da - dc)) for a, da in inside for c, dc in cols.items() if c >= 0]
        else:
            pairs = [
                ((min(a, b), max(a, b)), abs(da - db)) for i, (a, da) in enumerate(inside) for b, db in inside[i + 1 :]
            ]
        for key, d in pairs:
            counts[key] += 1
            dist[key] += d
    assert counts, "the phantom should join mask voxels"
    assert as_dict(result.matrix3) == dict(counts)
    got = as_dict(result.matrix3, lengths=True)
    assert all(abs(got[k] - dist[k]) < 1e-9 for k in dist)
    if not lowres:
        assert (result.matrix3.rows < result.matrix3.cols).all()  # FSL's upper triangle
    print(f"\n[{device}] matrix3 (lr {lowres}): {result.matrix3.nnz} non-zeros, {sum(counts.values())} counts")


def test_network_keeps_streamlines_reaching_another_mask(device):
    field_, brain, bundle, _ = phantom()
    bits = mask_bits(brain)
    masks = np.stack([bundle & np.isin(np.arange(SHAPE[0]), [x])[:, None, None] for x in (5, 15, 25)])
    masks[2] |= np.isin(np.arange(SHAPE[0]), [14])[:, None, None] & bundle  # overlaps mask 1's neighbour
    per_mask = [np.argwhere(m)[::3] for m in masks]
    seeds = np.concatenate(per_mask)
    own = np.repeat(np.arange(3), [len(s) for s in per_mask])
    spec = ConnectomeSpec(network_masks=masks, seed_mask_of_seed=own)
    result = track_connectome(
        field_, bits, seeds, PARAMS, spec, distthresh=0.0, distthresh3=0.0, lengths=True, device=device, chunk=40
    )
    visits, lengths = brute_visits(traced(device, field_, bits, seeds, PARAMS), PARAMS.step_mm)
    kept = brute_kept(visits, lengths, bits)
    _, seed_of = streamline_ids(0, len(visits), len(seeds), PARAMS.n_samples)
    matrix, waytotal = np.zeros((3, 3), int), np.zeros(3, int)
    paths = np.zeros(SHAPE, int)
    for first, k, s in zip(visits, kept, seed_of, strict=True):
        i = own[s]
        reached = {j for v in first for j in range(3) if j != i and masks[j][v]}
        if not k or not reached:
            continue
        waytotal[i] += 1
        for j in reached:
            matrix[i, j] += 1
        for v in first:
            paths[v] += 1
    assert np.array_equal(result.network.dense(), matrix) and np.array_equal(result.waytotal, waytotal)
    assert np.array_equal(result.paths, paths) and matrix[0, 1] > 0


def test_distthresh_discards_short_streamlines_everywhere():
    field_, brain, _, seeds = phantom()
    bits = mask_bits(brain)
    args = (field_, bits, seeds, PARAMS, ConnectomeSpec())
    every = track_connectome(*args, distthresh=0.0, distthresh3=0.0, lengths=False, device="cpu")
    visits, lengths = brute_visits(traced("cpu", field_, bits, seeds, PARAMS), PARAMS.step_mm)
    threshold = float(np.median(lengths))
    long_ = track_connectome(*args, distthresh=threshold, distthresh3=0.0, lengths=False, device="cpu")
    assert long_.waytotal[0] == sum(brute_kept(visits, lengths, bits, distthresh=threshold)) < every.waytotal[0]


def test_counts_do_not_depend_on_chunks_or_buffer_size():
    field_, brain, bundle, seeds = phantom()
    bits = mask_bits(brain)
    mask3 = bundle & np.isin(np.arange(SHAPE[0]), [3, 26])[:, None, None]
    spec = ConnectomeSpec(matrix3_nodes=numbered(mask3), n_matrix3_nodes=int(mask3.sum()))
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False, device="cpu")
    a = track_connectome(field_, bits, seeds, PARAMS, spec, chunk=len(seeds) * PARAMS.n_samples, **kw)
    b = track_connectome(field_, bits, seeds, PARAMS, spec, chunk=13, capacity=16, device_entries=40, **kw)
    assert b.provenance["spills"] > a.provenance["spills"]
    assert np.array_equal(a.matrix3.dense(), b.matrix3.dense()) and np.array_equal(a.paths, b.paths)


def test_a_chunk_out_of_memory_is_retried_smaller_and_counts_the_same(monkeypatch):
    import tractlens.gpu.connectome as engine

    field_, brain, bundle, seeds = phantom()
    bits = mask_bits(brain)
    mask3 = bundle & np.isin(np.arange(SHAPE[0]), [3, 26])[:, None, None]
    spec = ConnectomeSpec(matrix3_nodes=numbered(mask3), n_matrix3_nodes=int(mask3.sum()))
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False, device="cpu", chunk=64)
    before = track_connectome(field_, bits, seeds, PARAMS, spec, **kw)
    real = engine.visits_from_trace

    def tight(xp, trace, *args):
        if len(trace) > 20:
            raise MemoryError("simulated: the chunk does not fit")
        return real(xp, trace, *args)

    monkeypatch.setattr(engine, "visits_from_trace", tight)
    after = track_connectome(field_, bits, seeds, PARAMS, spec, **kw)
    assert after.provenance["notes"] and "chunks of 16" in after.provenance["notes"][-1]
    assert np.array_equal(after.matrix3.dense(), before.matrix3.dense()) and np.array_equal(after.paths, before.paths)


@pytest.mark.parametrize(
    "capacity, device_entries, host_tight", [(10**6, 10**6, False), (50, 50, False), (7, 300, False), (20, 40, True)]
)
def test_the_accumulator_sums_like_a_dense_matrix(device, capacity, device_entries, host_tight, monkeypatch):
    """Spilled or not, merged on the device or range by range (also while spilling, when the
    host is short of memory): the same sums as np.add.at."""
    import tractlens.gpu.connectome_counts as counts
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.connectome_counts import SparseAccumulator

    backend = get_backend(device)
    if host_tight:
        tight = type("Host", (), {"free_memory_bytes": lambda self: 0})()
        monkeypatch.setattr(counts, "get_backend", lambda name: tight)
    rng = np.random.default_rng(5)
    shape = (40, 70)
    acc = SparseAccumulator(backend, shape, 2, capacity, device_entries)
    dense = np.zeros((*shape, 2))
    for _ in range(30):
        n = int(rng.integers(0, 60))
        rows, cols = rng.integers(0, shape[0], n), rng.integers(0, shape[1], n)
        values = np.stack([np.ones(n), rng.random(n)], 1)
        np.add.at(dense, (rows, cols), values)
        acc.add(backend.asarray(rows), backend.asarray(cols), backend.asarray(values))
    result = acc.result()
    assert np.array_equal(result.dense(), dense[..., 0].astype(np.int64))
    assert np.allclose(result.to_scipy("lengths").toarray(), dense[..., 1], atol=1e-12)
    keys = result.rows * shape[1] + result.cols
    assert (np.diff(keys) > 0).all() and (result.counts > 0).all()
    if device_entries < 100:
        assert acc.spills > 1
    if host_tight:
        assert acc.host_merges > 0 and acc.host_merges == acc.spills - 1  # merged on every spill after the first


@pytest.mark.gpu
@pytest.mark.parametrize("gpu_visits", ["list", "trace"])
def test_the_gpu_counts_what_numpy_counts_bit_for_bit(gpu_visits):
    """Same random streams, same steps (float64 positions), same integer counts."""
    field_, brain, bundle, seeds = phantom()
    bits = mask_bits(brain)
    mask3 = bundle & np.isin(np.arange(SHAPE[0]), [2, 3, 14, 25, 26])[:, None, None]
    columns = np.full(SHAPE, -1, dtype=np.int64)
    columns[1:-1] = (np.arange(1, SHAPE[0] - 1) // 3)[:, None, None]
    spec = ConnectomeSpec(
        matrix2_columns=columns,
        n_matrix2_columns=int(columns.max()) + 1,
        matrix3_nodes=numbered(mask3),
        n_matrix3_nodes=int(mask3.sum()),
    )
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False)
    cpu = track_connectome(field_, bits, seeds, PARAMS, spec, device="cpu", **kw)
    gpu = track_connectome(field_, bits, seeds, PARAMS, spec, device="gpu", chunk=100, gpu_visits=gpu_visits, **kw)
    assert gpu.provenance["engine"] == f"kernel {'visit list' if gpu_visits == 'list' else 'trace'}"
    assert not gpu.provenance["notes"]  # the visit list agreed with the traces on the first chunk
    for name in ("matrix2", "matrix3"):
        a, b = getattr(cpu, name), getattr(gpu, name)
        assert np.array_equal(a.rows, b.rows) and np.array_equal(a.cols, b.cols) and np.array_equal(a.counts, b.counts)
    assert np.array_equal(cpu.paths, gpu.paths) and np.array_equal(cpu.waytotal, gpu.waytotal)


class ListingTracker:
    """Stands in for the CUDA kernel's visit-list build (no GPU here): the NumPy tracker's
    streamlines, and what the kernel promises for them — each kept streamline's distinct
    voxels in one contiguous block with its id, blocks and voxels in any order."""

    lie = False  # a wrong voxel in the list: the check against the traces must catch it

    def __init__(self, backend, field_, bits, seeds, params, n_targets, n_waypoints, *, max_batch, visit_list):
        self.args, self.visit_list = (field_, bits, seeds, params, n_waypoints), visit_list
        self.visit_buffers = None
        self.launches = 0

    def set_visit_buffers(self, sid, voxel, count):
        self.visit_buffers = (sid, voxel, count)

    def launch(self, first, count, trace=None):
        from tractlens.gpu.connectome import _trace_host
        from tractlens.gpu.connectome_modes import kept_streamlines, visits_from_trace

        field_, bits, seeds, params, n_waypoints = self.args
        self.launches += 1
        steps = _trace_host(field_, bits, seeds, params, n_waypoints, first, count)
        if trace is not None:
            trace[:] = np.concatenate([steps, np.repeat(steps[:, :, -1:], trace.shape[2] - steps.shape[2], 2)], 2)
        if not self.visit_list:  # the trace build (after a failed check)
            return
        visits = visits_from_trace(np, steps, field_.shape, params.step_mm)
        kept = kept_streamlines(np, visits, bits.reshape(-1), n_waypoints, params.waycond, 0.0)
        ids, _ = streamline_ids(first, count, len(seeds), params.n_samples)
        rng = np.random.default_rng(first)
        sid, voxel, counter = self.visit_buffers
        n = 0
        for i in rng.permutation(count):
            if kept[i]:
                mine = rng.permutation(visits.voxel[visits.stream == i])
                if self.lie:
                    mine[0] += 1
                room = max(0, min(len(mine), len(sid) - n))
                sid[n : n + room], voxel[n : n + room] = ids[i], mine[:room]
                n += len(mine)
        counter[0] = n


def test_the_gpu_visit_lists_count_what_the_traces_count(monkeypatch):
    """The host side of the kernel's visit lists (ids to run positions, blocks in any order,
    a buffer too small run again, the first chunk checked against traces) on the CPU."""
    import tractlens.gpu.connectome as engine
    from tractlens.gpu.backend import Backend

    class Listing(Backend):  # the GPU code path, with NumPy arrays
        def to_host(self, array):
            return np.asarray(array)

        def free_memory_bytes(self):
            return 2**30

        def is_out_of_memory(self, exc):
            return isinstance(exc, MemoryError)

        def free_cached_memory(self):
            pass

    gpu_like = Listing("gpu", np, "visit-list stand-in")
    monkeypatch.setattr(engine, "KernelTracker", ListingTracker)
    monkeypatch.setattr(engine, "LIST_SLOTS", 4)  # far too few: every chunk runs again with room
    field_, brain, bundle, _ = phantom()
    masks = np.stack([bundle & np.isin(np.arange(SHAPE[0]), [x])[:, None, None] for x in (5, 15, 25)])
    per_mask = [np.argwhere(m)[::3] for m in masks]
    seeds = np.concatenate(per_mask)
    columns = np.full(SHAPE, -1, dtype=np.int64)
    columns[1:-1] = (np.arange(1, SHAPE[0] - 1) // 3)[:, None, None]
    mask3 = bundle & np.isin(np.arange(SHAPE[0]), [2, 3, 14, 25, 26])[:, None, None]
    spec = ConnectomeSpec(
        matrix2_columns=columns,
        n_matrix2_columns=int(columns.max()) + 1,
        matrix3_nodes=numbered(mask3),
        n_matrix3_nodes=int(mask3.sum()),
        network_masks=masks,
        seed_mask_of_seed=np.repeat(np.arange(3), [len(p) for p in per_mask]),
    )
    bits = mask_bits(brain, exclude=np.isin(np.arange(SHAPE[0]), [27])[:, None, None] & bundle)
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False, chunk=50)
    reference = track_connectome(field_, bits, seeds, PARAMS, spec, device="cpu", **kw)
    monkeypatch.setattr(engine._VisitSource, "CHECK_STREAMLINES", 20)
    for lie in (False, True):
        monkeypatch.setattr(ListingTracker, "lie", lie)
        listed = track_connectome(field_, bits, seeds, PARAMS, spec, device=gpu_like, gpu_visits="auto", **kw)
        assert listed.provenance["engine"] == ("kernel trace" if lie else "kernel visit list")
        assert bool(listed.provenance["notes"]) == lie
        for name in ("matrix2", "matrix3", "network"):
            assert np.array_equal(getattr(listed, name).dense(), getattr(reference, name).dense()), (lie, name)
        assert np.array_equal(listed.paths, reference.paths) and np.array_equal(listed.waytotal, reference.waytotal)
    with pytest.raises(ValueError, match="no path lengths"):
        track_connectome(field_, bits, seeds, PARAMS, spec, device=gpu_like, gpu_visits="list", lengths=True,
                         distthresh=0.0, distthresh3=0.0)  # fmt: skip


def test_a_file_that_is_no_fsl_matrix_is_named(tmp_path):
    from tractlens.app.errors import InputError
    from tractlens.app.io.fsl_matrix import read_fdt_matrix

    bad = tmp_path / "fdt_matrix2.dot"
    bad.write_text("1 2\n3 4\n")
    with pytest.raises(InputError, match="3 columns"):
        read_fdt_matrix(bad)


# --------------------------------------------------------------------------- files and CLI


def _masks(demo_dir, tmp_path):
    seed = demo_dir / "roi_crossing_lr_seed.nii.gz"
    img = nib.load(seed)
    target = nib.load(demo_dir / "roi_crossing_lr_target.nii.gz")
    both = (img.get_fdata() > 0) | (target.get_fdata() > 0)
    target3 = tmp_path / "target3.nii.gz"
    nib.save(nib.Nifti1Image(both.astype(np.uint8), img.affine), target3)
    coarse = img.affine.copy()
    coarse[:3, :3] *= 2  # the low-resolution target2: every other voxel, twice the size
    low = np.ones(tuple(s // 2 for s in both.shape), np.uint8)
    target2 = tmp_path / "target2.nii.gz"
    nib.save(nib.Nifti1Image(low, coarse), target2)
    network = tmp_path / "masks.txt"
    network.write_text(f"{seed}\n{demo_dir / 'roi_crossing_lr_target.nii.gz'}\n")
    return seed, target2, target3, network


def test_the_command_writes_fsl_files_that_read_back(demo_bedpostx, demo_dir, tmp_path):
    import scipy.io
    import scipy.sparse

    from tests.test_cli import run_cli
    from tractlens.app.io.fsl_matrix import read_fdt_matrix

    seed, target2, target3, _ = _masks(demo_dir, tmp_path)
    out = tmp_path / "ptx"
    args = ["track", "probabilistic", "--samples", str(demo_bedpostx), "--seed", str(seed), "--nsamples", "5"]
    args += ["--omatrix2", "--target2", str(target2), "--omatrix3", "--target3", str(target3), "--ompl"]
    result = run_cli(*args, "--matrix-format", "both", "--device", "cpu", "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    for name in ("fdt_matrix2", "fdt_matrix3"):
        table = np.loadtxt(out / f"{name}.dot")
        n_rows, n_cols, zero = table[-1]
        assert zero == 0 and table[:-1, :2].min() >= 1  # 1-based, the size line last
        assert table[:-1, 0].max() <= n_rows and table[:-1, 1].max() <= n_cols
        matrix = read_fdt_matrix(out / f"{name}.dot")
        npz = scipy.sparse.load_npz(out / f"{name}.npz")
        assert (matrix != npz).nnz == 0 and matrix.nnz == summary["matrices"][name[4:]]["nonzeros"] > 0
        # what MATLAB's spconvert does with the same lines
        dense = np.zeros((int(n_rows), int(n_cols)))
        np.add.at(dense, (table[:-1, 0].astype(int) - 1, table[:-1, 1].astype(int) - 1), table[:-1, 2])
        assert np.array_equal(dense, matrix.toarray())
        mmwrite = tmp_path / f"{name}.mtx"
        scipy.io.mmwrite(mmwrite, matrix)
        assert (scipy.io.mmread(mmwrite) != matrix).nnz == 0
    m2 = read_fdt_matrix(out / "fdt_matrix2.dot").tocsr()
    coords = np.loadtxt(out / "coords_for_fdt_matrix2", dtype=int)
    n_seed = int((nib.load(seed).get_fdata() > 0).sum())
    assert coords.shape == (n_seed, 5) and np.array_equal(coords[:, 4], np.arange(n_seed))
    assert np.array_equal(coords[:, :3], coords[np.lexsort(coords[:, :3].T)][:, :3])  # FSL order: x fastest
    tract = np.loadtxt(out / "tract_space_coords_for_fdt_matrix2", dtype=int)
    lookup = np.asarray(nib.load(out / "lookup_tractspace_fdt_matrix2.nii.gz").dataobj)
    assert np.array_equal(lookup[tuple(tract.T)], np.arange(1, len(tract) + 1)) and m2.shape == (n_seed, len(tract))
    # every kept streamline passes its own seed voxel's low-res voxel: row sums ≥ the streamlines per seed
    assert (np.asarray(m2.sum(axis=1)).ravel() >= 5).all()
    lengths = read_fdt_matrix(out / "fdt_matrix3_lengths.dot")
    assert lengths.nnz == read_fdt_matrix(out / "fdt_matrix3.dot").nnz and (lengths.data > 0).all()
    assert "--omatrix3" in (out / "probtrackx.log").read_text() and (out / "fdt_paths_lengths.nii.gz").exists()
    assert int((out / "waytotal").read_text()) == summary["waytotal"][0] == summary["streamlines"]


def test_network_files_and_fslpy_layout(demo_bedpostx, demo_dir, tmp_path):
    from tests.test_cli import run_cli

    _, _, _, network = _masks(demo_dir, tmp_path)
    out = tmp_path / "net"
    args = ["track", "probabilistic", "--samples", str(demo_bedpostx), "--seed", str(network), "--network"]
    result = run_cli(*args, "--nsamples", "5", "--pd", "--device", "cpu", "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    matrix = np.loadtxt(out / "fdt_network_matrix")
    assert matrix.shape == (2, 2) and np.trace(matrix) == 0 and matrix[0, 1] > 0  # --pd: summed mm
    waytotal = np.loadtxt(out / "waytotal", ndmin=1)
    assert waytotal.tolist() == summary["waytotal"] and len(waytotal) == 2
    filetree = pytest.importorskip("fsl.utils.filetree", reason="fslpy is not installed")
    tree = filetree.FileTree.read("ProbtrackX", directory=str(out))
    for name in ("network", "log_cmd", "waytotal", "path"):
        assert Path(tree.get(name)).exists(), name


def test_fslpy_finds_the_matrix_files(demo_bedpostx, demo_dir, tmp_path):
    import os

    from tests.test_cli import run_cli

    filetree = pytest.importorskip("fsl.utils.filetree", reason="fslpy is not installed")
    seed, target2, target3, _ = _masks(demo_dir, tmp_path)
    out = tmp_path / "ptx"
    args = ["track", "probabilistic", "--samples", str(demo_bedpostx), "--seed", str(seed), "--nsamples", "2"]
    args += ["--omatrix2", "--target2", str(target2), "--omatrix3", "--target3", str(target3)]
    assert run_cli(*args, "--device", "cpu", "-o", str(out)).returncode == 0
    tree = filetree.FileTree.read("ProbtrackX", directory=str(out))
    for mat_id, names in (("2", ("mat", "mat_seed_coord", "mat_target_space", "mat_target_coord")), ("3", ("mat",))):
        for name in names:
            assert os.path.exists(tree.update(mat_id=mat_id).get(name)), (mat_id, name)


@pytest.mark.parametrize(
    "extra, expect",
    [
        (["--omatrix2"], "--omatrix2 needs --target2"),
        (["--target3", "SEED"], "--target3 is only used with --omatrix3"),
        (["--omatrix3", "--target3", "SEED", "--target", "SEED"], "--target cannot be combined"),
        (["--lrtarget3", "SEED"], "--lrtarget3 is only used with --omatrix3"),
        (["--network"], "at least two masks"),
        (["--distthresh", "-1"], "at least 0"),
    ],
)
def test_connectome_mode_mistakes_are_named(demo_bedpostx, demo_dir, tmp_path, extra, expect):
    from tests.test_cli import run_cli

    seed = str(demo_dir / "roi_crossing_lr_seed.nii.gz")
    if "--network" in extra:
        listed = tmp_path / "one.txt"
        listed.write_text(seed + "\n")
        seed = str(listed)
    extra = [seed if e == "SEED" else e for e in extra]
    args = ["track", "probabilistic", "--samples", str(demo_bedpostx), "--seed", seed, "--nsamples", "2", *extra]
    result = run_cli(*args, "--device", "cpu", "-o", str(tmp_path / "o"))
    assert result.returncode != 0 and expect in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
