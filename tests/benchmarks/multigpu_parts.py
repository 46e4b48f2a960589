"""The in-process parts of bench_multigpu.py: the dense connectome (``--omatrix3``) and COMMIT on
1 and N GPUs. Each returns a JSON-able dict; nothing here is run by the test suite."""

from __future__ import annotations

import math
import time

import numpy as np

from tractlens.gpu.connectome import ConnectomeSpec, track_connectome
from tractlens.gpu.connectome_split import track_connectome_split
from tractlens.gpu.multidevice import device_label
from tractlens.gpu.probabilistic_params import ProbParams, mask_bits


def _free_all(backends) -> None:
    for b in (b for b in backends if b.is_gpu):
        with b.activate():
            b.xp.get_default_memory_pool().free_all_blocks()


def _used_bytes(backends) -> dict:
    out = {}
    for b in (b for b in backends if b.is_gpu):
        with b.activate():
            free, total = b.xp.cuda.runtime.memGetInfo()
            out[device_label(b)] = int(total - free)
    return out


# ----------------------------------------------------------------------------- omatrix3
def omatrix3(subject, backends, streamlines: float, one_gpu_streamlines: float, check_streamlines: float,
             log) -> dict:  # fmt: skip
    """probtrackx's defaults, the bedpostX brain's outermost voxel layer as seeds and target3 (an
    HCP dense connectome's grey/white boundary, as bench_connectome.py). The same counts on 1
    and N GPUs are checked on ``check_streamlines``; the 1-GPU rate on ``one_gpu_streamlines``
    (its time for ``streamlines`` is extrapolated: tracking is linear in streamlines), the N-GPU
    run on ``streamlines``."""
    from scipy import ndimage

    from tractlens.app.io import load_bedpostx
    from tractlens.app.pipelines.probabilistic import sample_field

    t0 = time.perf_counter()
    samples = load_bedpostx(subject / "bedpostx")
    field_ = sample_field(samples)
    brain = samples.mask
    layer = brain & ~ndimage.binary_erosion(brain, np.ones((3, 3, 3), bool))
    seeds = np.ascontiguousarray(np.argwhere(layer))
    nodes = np.full(brain.shape, -1, np.int64)
    nodes[tuple(seeds.T)] = np.arange(len(seeds))
    spec = ConnectomeSpec(matrix3_nodes=nodes, n_matrix3_nodes=len(seeds))
    bits = mask_bits(brain)
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False)
    n_gpus, first = len(backends), backends[0]
    row = {"boundary_voxels": len(seeds), "brain_voxels": int(brain.sum()), "load_s": round(time.perf_counter() - t0, 1),
           "params": "probtrackx defaults (0.5 mm, 2000 steps, cthr 0.2, fibthresh 0.01)"}  # fmt: skip

    def params(total: float) -> ProbParams:
        return ProbParams(n_samples=max(1, math.ceil(total / len(seeds))))

    t0 = time.perf_counter()  # kernels compiled and loaded on every device
    track_connectome(field_, bits, seeds[:2000], ProbParams(n_samples=5), spec, device=first, **kw)
    if n_gpus > 1:
        track_connectome_split(field_, bits, seeds[:2000], ProbParams(n_samples=5), spec, backends, **kw)
    _free_all(backends)
    row["warm_up_s"] = round(time.perf_counter() - t0, 1)
    log(f"omatrix3: warm, {len(seeds)} seeds")

    p = params(check_streamlines)
    a = track_connectome(field_, bits, seeds, p, spec, device=first, **kw)
    _free_all(backends)
    b = track_connectome_split(field_, bits, seeds, p, spec, backends, **kw)
    _free_all(backends)
    same = (np.array_equal(a.paths, b.paths) and np.array_equal(a.waytotal, b.waytotal)
            and np.array_equal(a.matrix3.rows, b.matrix3.rows) and np.array_equal(a.matrix3.cols, b.matrix3.cols)
            and np.array_equal(a.matrix3.counts, b.matrix3.counts))  # fmt: skip
    row["check"] = {"streamlines": a.streamlines, "identical_1_vs_n": bool(same), "nonzeros": a.matrix3.nnz}
    log(f"omatrix3: 1 vs {n_gpus} GPUs identical on {a.streamlines / 1e6:.0f} M: {same}")
    del a, b

    p = params(one_gpu_streamlines)
    t0 = time.perf_counter()
    one = track_connectome(field_, bits, seeds, p, spec, device=first, **kw)
    s1 = time.perf_counter() - t0
    row["one_gpu"] = {"streamlines": one.streamlines, "s": round(s1, 2), "streamlines_per_s": round(one.streamlines / s1),
                      "extrapolated_s_for_n_gpu_streamlines": None, "peak_pool_bytes": one.provenance["peak_device_pool_bytes"]}  # fmt: skip
    log(f"omatrix3 on 1 GPU: {one.streamlines / 1e6:.0f} M in {s1:.1f} s")
    del one
    _free_all(backends)

    p = params(streamlines)
    t0 = time.perf_counter()
    many = track_connectome_split(field_, bits, seeds, p, spec, backends, **kw)
    sn = time.perf_counter() - t0
    prov = many.provenance
    row["one_gpu"]["extrapolated_s_for_n_gpu_streamlines"] = round(
        s1 * many.streamlines / row["one_gpu"]["streamlines"], 1
    )
    row["n_gpus"] = {
        "gpus": n_gpus, "streamlines": many.streamlines, "s": round(sn, 2),
        "streamlines_per_s": round(many.streamlines / sn), "matrix3_nonzeros": many.matrix3.nnz,
        "matrix3_total_count": int(many.matrix3.counts.sum()), "merge_s": prov["merge_s"],
        "merged_on": prov["merged_on"], "shared_tracking_s": prov["shared_tracking_s"], "devices": prov["devices"],
        "spills": prov["spills"], "notes": prov["notes"], "pool_bytes_per_device": prov["device_pool_peak_bytes"],
    }  # fmt: skip
    row["speedup"] = round(row["one_gpu"]["extrapolated_s_for_n_gpu_streamlines"] / sn, 2)
    row["efficiency"] = round(row["speedup"] / n_gpus, 3)
    row["target"] = "≤ 25 s for 500 M streamlines on 4 GPUs (84.6 s on one, bench_connectome.py's field)"
    log(f"omatrix3 on {n_gpus} GPUs: {many.streamlines / 1e6:.0f} M in {sn:.1f} s (merge {prov['merge_s']} s)")
    del many
    _free_all(backends)
    return row


# ----------------------------------------------------------------------------- COMMIT
#: One elementwise pass makes a block of a synthetic COMMIT problem on its device, in the order
#: the operator needs (sorted by voxel row) and with its listing by streamline, with no sort: the
#: k-th segment of streamline f lies in voxel row k·G + f mod G (G = fibers per row group), so
#: row order is (k, f mod G, f div G) and streamline order (f, k) maps to it by a formula.
_MAKE = (
    "int64 F, int64 G, int64 K, int64 base, int64 row0",
    "int32 row, int32 fiber, float64 length, uint16 orient, int64 by_fiber",
    """
    long long per = F / G;
    long long ig = (long long)i + base;  /* the segment's number in the whole problem */
    long long k = ig / F, rem = ig % F, g = rem / per, q = rem % per;
    row = (int)(k * G + g - row0);
    fiber = (int)(q * G + g);
    unsigned long long h = (unsigned long long)ig * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    length = 0.3 + (double)(h % 1000) * 0.0012;
    orient = (unsigned short)((h >> 17) % 32761);
    long long j = i;  /* the j-th segment of the block in streamline order */
    long long fj = j / K, kj = j % K;
    by_fiber = kj * F + (fj % G) * per + fj / G;
    """,
    "tractlens_bench_commit_block",
)


def _block(cp, n_fibers: int, groups: int, k_segments: int, k_first: int, luts):
    """A synthetic block on the current device, the segments ``k_first … k_first + k_segments − 1``
    of every streamline (the same numbers whatever the split): (Problem, n_rows)."""

    n = n_fibers * k_segments
    row0 = k_first * groups
    if cp is np:  # the same formulas with NumPy (a check of the script without a GPU)
        i = np.arange(n, dtype=np.int64)
        per, ig = n_fibers // groups, i + k_first * n_fibers
        k, rem = ig // n_fibers, ig % n_fibers
        g, q = rem // per, rem % per
        h = (ig.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
        h ^= h >> np.uint64(31)
        fj, kj = i // k_segments, i % k_segments
        row, fiber = (k * groups + g - row0).astype(np.int32), (q * groups + g).astype(np.int32)
        length = 0.3 + (h % np.uint64(1000)).astype(np.float64) * 0.0012
        orient = ((h >> np.uint64(17)) % np.uint64(32761)).astype(np.uint16)
        by_fiber = kj * n_fibers + (fj % groups) * per + fj // groups
        return _assemble(row, fiber, length, orient, by_fiber, n_fibers, k_segments * groups, row0, luts)
    row = cp.empty(n, cp.int32)
    fiber = cp.empty(n, cp.int32)
    length = cp.empty(n, cp.float64)
    orient = cp.empty(n, cp.uint16)
    by_fiber = cp.empty(n, cp.int64)
    cp.ElementwiseKernel(*_MAKE)(np.int64(n_fibers), np.int64(groups), np.int64(k_segments),
                                 np.int64(k_first * n_fibers), np.int64(row0), row, fiber, length, orient, by_fiber)  # fmt: skip
    return _assemble(row, fiber, length, orient, by_fiber, n_fibers, k_segments * groups, row0, luts)


def _assemble(row, fiber, length, orient, by_fiber, n_fibers, n_rows, row0, luts):
    from tractlens.gpu.commit_operator import Problem
    from tractlens.gpu.commit_segments import Segments

    seg = Segments(row, fiber, length, orient, n_fibers, by_fiber=by_fiber)
    ec_row = np.arange(n_rows, dtype=np.int32)
    ec_orient = ((np.arange(row0, row0 + n_rows, dtype=np.int64) * 7919) % 32761).astype(np.int32)
    return Problem(n_rows, seg, ec_row, ec_orient, *luts), n_rows


def _luts(n_meas: int, rng):
    ic = rng.random((1, 32761, n_meas), dtype=np.float32)
    ec = rng.random((32761, n_meas), dtype=np.float32)
    iso = rng.random((2, n_meas), dtype=np.float32)
    return ic, ec, iso


def commit_problem(backends, n_fibers: int, segments_per_fiber: int, n_meas: int, groups: int):
    """A SplitOperator's parts made on their devices (each device a contiguous block of rows:
    ``segments_per_fiber / len(backends)`` segments of every streamline), and the whole problem's
    shape (no segments on the host)."""
    from tractlens.gpu.commit_operator import Problem
    from tractlens.gpu.commit_segments import Segments

    rng = np.random.default_rng(0)
    luts = _luts(n_meas, rng)
    k_each = segments_per_fiber // len(backends)
    parts, r0, e0 = [], 0, 0
    for d, b in enumerate(backends):
        with b.activate():
            sub, n_rows = _block(b.xp, n_fibers, groups, k_each, d * k_each, luts)
            b.synchronize()
        parts.append((b, sub, r0, r0 + n_rows, e0, e0 + n_rows))
        r0, e0 = r0 + n_rows, e0 + n_rows
    empty = Segments(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.uint16), n_fibers)
    whole = Problem(r0, empty, np.arange(r0, dtype=np.int32), np.zeros(r0, np.int32), *luts)
    return whole, parts


def _direct(backend, sub):
    from tractlens.gpu.commit_device import DeviceOperator
    from tractlens.gpu.commit_operator import NumpyOperator

    return DeviceOperator(backend, sub) if backend.is_gpu else NumpyOperator(sub)


def commit_case(backends, n_fibers: int, segments_per_fiber: int, n_meas: int, iterations: int,
                fit_iterations: int, compare_one: bool, log) -> dict:  # fmt: skip
    """Build the operator over ``n_gpus`` GPUs (one resident device operator each), time A x + Aᵀ y
    (one FISTA iteration's products) ``iterations`` times, peak memory per device; with
    ``compare_one``, also the same problem's weights after ``fit_iterations`` FISTA iterations on
    1 GPU (the whole problem on GPU 0) and on ``n_gpus``: the largest difference relative to the
    largest weight (float32 epsilon is 1.2e-7)."""
    from tractlens.gpu.commit_multi import SplitOperator
    from tractlens.gpu.commit_solver import fista

    n_gpus = len(backends)
    groups = max(1, n_fibers // 4000)  # about 4,000 segments per voxel row
    while n_fibers % groups:
        groups -= 1
    row = {"gpus": n_gpus, "streamlines": n_fibers, "segments": n_fibers * segments_per_fiber, "measurements": n_meas}

    def run(bs, label):
        t0 = time.perf_counter()
        whole, parts = commit_problem(bs, n_fibers, segments_per_fiber, n_meas, groups)
        op = SplitOperator(bs, whole, parts=parts, make=_direct)
        del parts
        built = time.perf_counter() - t0
        cp = bs[0].xp
        x = cp.asarray(np.random.default_rng(1).random(whole.n_cols))
        op.at(op.a(x))  # warm
        bs[0].synchronize()
        t0 = time.perf_counter()
        for _ in range(iterations):
            op.at(op.a(x))
        bs[0].synchronize()
        per = (time.perf_counter() - t0) / iterations
        out = {"build_s": round(built, 2), "s_per_iteration": round(per, 4), "rows": whole.n_rows,
               "segments_per_device": op.provenance()["segments_per_device"]}  # fmt: skip
        weights = None
        if compare_one:
            y = op.a(cp.asarray(np.random.default_rng(2).random(whole.n_cols)))
            t0 = time.perf_counter()
            fit = fista(op.a, op.at, y, whole.n_cols, scale=op.column_norms(), n_penalised=whole.n_ic_cols,
                        max_iter=fit_iterations, tol=0.0, xp=cp)  # fmt: skip
            out["fista_s"] = round(time.perf_counter() - t0, 2)
            weights = bs[0].to_host(fit.x[: whole.n_ic_cols])
        out["pool_peak_bytes_per_device"] = op.provenance()["device_pool_peak_bytes"]
        out["used_bytes_per_device"] = _used_bytes(bs)
        log(f"COMMIT {label}: {row['segments'] / 1e9:.2f} G segments, {per:.3f} s per iteration")
        del op, x
        _free_all(bs)
        return out, weights

    if compare_one:
        row["one_gpu"], w1 = run(backends[:1], "on 1 GPU")
    row["n_gpus"], wn = run(backends, f"on {n_gpus} GPUs")
    if compare_one:
        scale = float(np.abs(w1).max()) or 1.0
        row["max_weight_difference_relative"] = float(np.abs(wn - w1).max() / scale)
        row["within_float32"] = row["max_weight_difference_relative"] <= float(np.finfo(np.float32).eps)
        row["speedup_per_iteration"] = round(row["one_gpu"]["s_per_iteration"] / row["n_gpus"]["s_per_iteration"], 2)
    return row


# ----------------------------------------------------------------------------- probabilistic stages
def attribute(devices: list[dict] | None, tracking_s: float | None, merge_s: float | None) -> dict | None:
    """Where a split run's tracking time went, from its devices' stages and timelines (seconds):
    ``tracking_s`` = ``last_finished`` (the run's start to the last device's totals in) + ``merge``
    + ``outside`` (threads started and joined, the result's provenance). ``last_finished`` is the
    slowest device's ``ready`` (its opening: start, its part of the upload, the gather, the
    set-up, each also given per device) + its ``compute`` + its ``finish``; ``end_spread``: how far
    apart the devices' last chunks ended (the split's balance)."""
    if not devices or tracking_s is None:
        return None
    live = [d for d in devices if not d.get("failed") and d.get("timeline_s")]
    if not live:
        return None

    def per(key, stage=True):
        return [round((d["stages_s"] if stage else d["timeline_s"]).get(key, 0.0), 4) for d in live]

    finished = per("finished", stage=False)
    last = max(finished)
    out = {
        "tracking_s": round(tracking_s, 4),
        "last_finished_s": last,
        "merge_s": merge_s,
        "outside_s": round(tracking_s - last - (merge_s or 0.0), 4),
        "ready_s": per("ready", stage=False),
        "done_s": per("done", stage=False),
        "finished_s": finished,
        "end_spread_s": round(max(per("done", stage=False)) - min(per("done", stage=False)), 4),
    }
    for stage in ("start", "upload", "gather_wait", "gather", "setup", "setup_arrays", "setup_kernel", "setup_sets",
                  "field_wait", "open", "compute", "drain", "copy_back", "host_add", "finish"):  # fmt: skip
        out[f"{stage}_s"] = per(stage)
    slowest = finished.index(last)
    out["slowest_device"] = live[slowest]["device"]
    out["items_per_s_per_device"] = [round(d["items"] / d["stages_s"]["compute"]) if d["stages_s"].get("compute")
                                     else None for d in live]  # fmt: skip
    return out


def prob_stages(subject, counts, nsamples: int, backends_of, log, lanes_options=(1, 2)) -> list[dict]:
    """The split run in this process for every GPU count (1 included, which the command runs
    without the split) and each number of lanes (streams per GPU): each device's stages
    (start, upload, gather, setup, compute, finish) and timeline, the merge, the tracking seconds
    and their attribution (:func:`attribute`), and whether the counts equal the first run's."""
    from tractlens.app.io import load_bedpostx
    from tractlens.app.pipelines.probabilistic import sample_field
    from tractlens.gpu.probabilistic_split import track_split

    samples = load_bedpostx(subject / "bedpostx")
    field_ = sample_field(samples)
    seeds = np.ascontiguousarray(np.argwhere(samples.mask))
    bits = mask_bits(samples.mask)
    params = ProbParams(n_samples=nsamples)
    for lanes in lanes_options:  # contexts, kernels and staging buffers of every device made before timing
        track_split(field_, bits, seeds[:5000], ProbParams(n_samples=2), backends_of(max(counts)), lanes=lanes)
    rows, first = [], None
    for lanes in lanes_options:
        for n in counts:
            backends = backends_of(n)
            t0 = time.perf_counter()
            result = track_split(field_, bits, seeds, params, backends, lanes=lanes)
            seconds = time.perf_counter() - t0
            same = first is None or (np.array_equal(result.paths, first.paths) and result.waytotal == first.waytotal)
            first = first or result
            prov = result.provenance
            rows.append({"gpus": n, "lanes": lanes, "tracking_s": round(seconds, 3), "streamlines": result.streamlines,
                         "merge_s": prov["merge_s"], "devices": prov["devices"], "same_as_first": bool(same),
                         "attribution": attribute(prov["devices"], seconds, prov["merge_s"])})  # fmt: skip
            log(f"prob split in-process on {n} GPU(s), {lanes} lane(s): {seconds:.2f} s (merge {prov['merge_s']} s), "
                f"same {same}")  # fmt: skip
            _free_all(backends)
    for row in rows:
        one = next(r["tracking_s"] for r in rows if r["gpus"] == rows[0]["gpus"] and r["lanes"] == row["lanes"])
        row["efficiency"] = round(one / row["tracking_s"] / (row["gpus"] / rows[0]["gpus"]), 3)
    return rows


def chunk_cost(rows: list[dict]) -> dict | None:
    """A least-squares line through every timed chunk of one-lane runs (device seconds against
    streamlines): ``per_launch_s`` is what a launch costs beyond its streamlines (its tail, when
    the device empties), ``streamlines_per_s`` the rate in between. From the devices' ``chunk_s``."""
    points = [(n, s) for r in rows if r.get("lanes") == 1 for d in r["devices"] for n, s in d.get("chunk_s", [])]
    if len(points) < 3:
        return None
    n, s = np.array(points, dtype=np.float64).T
    slope, intercept = np.polyfit(n, s, 1)
    small = [(int(c), float(t)) for c, t in points if c <= 2 << 20]
    return {"chunks": len(points), "per_launch_s": round(float(intercept), 4),
            "streamlines_per_s": round(1 / slope) if slope > 0 else None, "small_chunks": small[:40]}  # fmt: skip


def prob_schedules(subject, n: int, nsamples: int, backends_of, log, smallest_options=(1 << 18, 1 << 20, 1 << 21),
                   lanes_options=(1, 2)) -> dict:  # fmt: skip
    """Where the split's compute goes against one GPU's batches, in this process: the 1-GPU
    batches of ``iter_track`` (the command without ``--gpus``; the field uploaded before the
    clock starts) beside the split on one GPU (now the same 8 M chunks), then the split on ``n``
    GPUs for each smallest chunk of the guided schedule (2^18 was the default before) and each
    number of lanes: tracking, the slowest device's compute, each device's chunks and the end
    spread; the counts checked equal."""
    from tractlens.app.io import load_bedpostx
    from tractlens.app.pipelines.probabilistic import sample_field
    from tractlens.gpu.probabilistic import track
    from tractlens.gpu.probabilistic_kernel import upload_field
    from tractlens.gpu.probabilistic_split import track_split

    samples = load_bedpostx(subject / "bedpostx")
    field_ = sample_field(samples)
    seeds = np.ascontiguousarray(np.argwhere(samples.mask))
    bits = mask_bits(samples.mask)
    params = ProbParams(n_samples=nsamples)
    out: dict = {"gpus": n, "runs": []}
    one = backends_of(1)
    with one[0].activate():
        arrays = upload_field(one[0], field_)
        one[0].synchronize()
        for _ in range(2):  # iter_track, then the split on the same GPU, twice
            t0 = time.perf_counter()
            ref = track(field_, bits, seeds, params, device=one[0], device_field=arrays if one[0].is_gpu else None)
            seconds = time.perf_counter() - t0
            out.setdefault("iter_track_1gpu_s", []).append(round(seconds, 3))
            split = track_split(field_, bits, seeds, params, one)
            d = split.provenance["devices"][0]
            out.setdefault("split_1gpu_compute_s", []).append(d["stages_s"].get("compute"))
            out["split_1gpu_chunks"] = d["chunks"]
            log(f"1 GPU: iter_track {seconds:.3f} s (field on the GPU), split compute {d['stages_s'].get('compute')} s "
                f"in {d['chunks']} chunks")  # fmt: skip
    del arrays
    _free_all(one)
    rows = []
    for lanes in lanes_options:
        for smallest in smallest_options:
            backends = backends_of(n)
            t0 = time.perf_counter()
            result = track_split(field_, bits, seeds, params, backends, lanes=lanes, smallest_chunk=smallest)
            seconds = time.perf_counter() - t0
            prov = result.provenance
            a = attribute(prov["devices"], seconds, prov["merge_s"])
            same = bool(np.array_equal(result.paths, ref.paths) and result.waytotal == ref.waytotal)
            rows.append({"gpus": n, "lanes": lanes, "smallest": smallest, "tracking_s": round(seconds, 3),
                         "compute_max_s": max(a["compute_s"]), "ready_max_s": max(a["ready_s"]),
                         "end_spread_s": a["end_spread_s"], "chunks": [d["chunks"] for d in prov["devices"]],
                         "same_as_one_gpu": same, "devices": prov["devices"], "attribution": a})  # fmt: skip
            log(f"{n} GPUs, {lanes} lane(s), smallest chunk {smallest}: {seconds:.3f} s, compute max "
                f"{max(a['compute_s']):.3f}, end spread {a['end_spread_s']}, same {same}")  # fmt: skip
            _free_all(backends)
    out["runs"] = rows
    out["chunk_cost"] = chunk_cost(rows)
    return out
