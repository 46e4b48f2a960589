"""A/B benchmark of the dense connectome (``--omatrix3``) on one GPU: CuPy's CUB block
reductions on and off, ``cupy.bincount`` against the engine's counting, per phase.

    python tests/benchmarks/bench_connectome_ab.py [--streamlines 5e7] [--out F.json]

On 27 Nov the same omatrix3 run went from 12.4 s (125 M streamlines, one H100, 14:02) to
33.3 s (20:24). Between the two, the engine turned CuPy's CUB *block* reductions off
(:func:`tractlens.gpu.backend.gpu_status`; ``TRACTLENS_CUB_BLOCK_REDUCTION=1`` keeps them).
``cupy.bincount`` checks ``(x < 0).any()`` before counting, and ``any`` has no device-wide
CUB routine: without the block reductions, CuPy's generic reduction kernel reduces a whole
array to one value with a single thread block. The connectome counts by value on every
chunk's visits and on every batch of pair entries (billions per run).

Two parts, in one process (the field is built once; the reduction accelerators are switched
in place, as the environment variable would at start):

1. ``micro``: on int64 arrays of 1 M, 30 M and 300 M values, the seconds of ``(x < 0).any()``,
   ``cupy.bincount`` and the engine's :func:`bincount_or_zeros`, with the block reductions
   off and on;
2. ``runs``: bench_connectome.py's HCP-sized synthetic field and boundary layer (its field
   with ``--field-samples`` posterior samples), ``--streamlines`` streamlines of omatrix3 with
   probtrackx's defaults, in four set-ups: block reductions off/on × the engine's counting /
   ``cupy.bincount`` (the code before this fix), each after a warm-up, with the phases of
   :class:`tractlens.gpu.connectome.ConnectomeCounter` (``visits``: tracking and the visit
   lists; ``paths``; ``entries``: matrix3's pairs; ``reduce``: sort and merge; ``result``)
   and whether its counts equal the first set-up's.

Expected if the cause is the one above: ``off + cupy.bincount`` much slower than the others,
its extra seconds in ``visits``/``paths``/``reduce`` (every phase that counts by value), and the
micro ``any`` at 300 M far slower off than on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_connectome import HCP_SHAPE, QUICK_SHAPE, boundary_layer, synthetic_field  # noqa: E402

from tractlens.gpu import connectome, connectome_counts, connectome_modes  # noqa: E402
from tractlens.gpu.backend import get_backend  # noqa: E402
from tractlens.gpu.connectome import ConnectomeSpec, track_connectome  # noqa: E402
from tractlens.gpu.probabilistic_params import ProbParams, mask_bits  # noqa: E402


def set_block_reductions(cp, on: bool) -> list:
    """CuPy's CUB block reductions on or off (the reduction accelerators); returns them."""
    if cp is np:  # --smoke
        return []
    core = cp._core
    kept = [a for a in core.get_reduction_accelerators() if a not in (1, "cub")]
    core.set_reduction_accelerators([1, *kept] if on else kept)  # 1: cupy._core._accelerator.ACCELERATOR_CUB
    return list(core.get_reduction_accelerators())


@contextlib.contextmanager
def cupy_bincount():
    """The connectome's counting as before the fix: ``xp.bincount`` and a boolean ``sum``."""

    def old_bincount(xp, x, minlength, weights=None):
        if len(x) == 0:
            return xp.zeros(minlength, dtype=xp.int64 if weights is None else xp.float64)
        return xp.bincount(x, weights=weights, minlength=minlength)

    def old_count(xp, mask):
        return mask.sum()

    patched = [(connectome_counts, "bincount_or_zeros", old_bincount), (connectome, "bincount_or_zeros", old_bincount),
               (connectome_modes, "bincount_or_zeros", old_bincount), (connectome, "count_true", old_count)]  # fmt: skip
    saved = [(m, name, getattr(m, name)) for m, name, _ in patched]
    for m, name, fn in patched:
        setattr(m, name, fn)
    try:
        yield
    finally:
        for m, name, fn in saved:
            setattr(m, name, fn)


def _timed(cp, fn, repeat: int = 3) -> float:
    fn()
    cp.cuda.Device().synchronize()
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t0)
    return round(best, 5)


def micro(cp, sizes, log) -> list[dict]:
    rows = []
    for on in (False, True):
        set_block_reductions(cp, on)
        for n in sizes:
            x = (cp.arange(int(n), dtype=cp.int64) * 2654435761) % (1 << 20)  # spread over 1 M bins
            row = {"block_reductions": on, "n": int(n)}
            row["any_s"] = _timed(cp, lambda x=x: bool((x < 0).any()))
            row["min_max_s"] = _timed(cp, lambda x=x: (int(x.min()), int(x.max())))
            row["cupy_bincount_s"] = _timed(cp, lambda x=x: cp.bincount(x, minlength=1 << 20))
            row["engine_bincount_s"] = _timed(cp, lambda x=x: connectome_counts.bincount_or_zeros(cp, x, 1 << 20))
            w = cp.ones(len(x))
            row["cupy_bincount_weighted_s"] = _timed(cp, lambda x=x, w=w: cp.bincount(x, w, minlength=1 << 20))
            row["engine_bincount_weighted_s"] = _timed(
                cp, lambda x=x, w=w: connectome_counts.bincount_or_zeros(cp, x, 1 << 20, w)
            )
            log(f"micro {row}")
            rows.append(row)
            del x, w
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streamlines", type=float, default=5e7, help="omatrix3 streamlines per set-up (5e7)")
    parser.add_argument("--field-samples", type=int, default=20, help="posterior samples of the synthetic field (20)")
    parser.add_argument("--micro-sizes", default="1e6,3e7,3e8", help="array sizes of the micro part ('' skips it)")
    parser.add_argument(
        "--setups", default="off+engine,off+cupy,on+cupy,on+engine", help="block reductions (on/off) + counting"
    )
    parser.add_argument("--out", help="write the JSON here (and the table beside it as .md)")
    parser.add_argument("--smoke", action="store_true", help="check the script with NumPy on a small grid (no GPU)")
    args = parser.parse_args(argv)
    shape = QUICK_SHAPE if args.smoke else HCP_SHAPE
    if args.smoke:
        args.streamlines, args.field_samples, args.micro_sizes = 3000, 10, ""
    backend = get_backend("cpu" if args.smoke else "gpu")  # gpu_status() has set the engine's accelerators
    cp = backend.xp

    def free():
        if backend.is_gpu:
            cp.get_default_memory_pool().free_all_blocks()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    core = getattr(cp, "_core", None)
    result = {"command": " ".join(["python tests/benchmarks/bench_connectome_ab.py", *(argv or sys.argv[1:])]),
              "device": backend.device_name, "cupy": cp.__version__ if backend.is_gpu else None,
              "reduction_accelerators_at_start": list(core.get_reduction_accelerators()) if backend.is_gpu else [],
              "routine_accelerators": list(core.get_routine_accelerators()) if backend.is_gpu else []}  # fmt: skip
    sizes = [float(s) for s in args.micro_sizes.split(",") if s]
    if sizes:
        result["micro"] = micro(cp, sizes, log)

    t0 = time.perf_counter()
    field_, brain = synthetic_field(shape, args.field_samples)
    seeds = np.ascontiguousarray(np.argwhere(boundary_layer(brain)))
    nodes = np.full(shape, -1, np.int64)
    nodes[tuple(seeds.T)] = np.arange(len(seeds))
    spec = ConnectomeSpec(matrix3_nodes=nodes, n_matrix3_nodes=len(seeds))
    bits = mask_bits(brain)
    params = ProbParams(n_samples=math.ceil(args.streamlines / len(seeds)))
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False, device=backend.name)
    result["field"] = {"shape": list(shape), "field_samples": args.field_samples, "boundary_voxels": len(seeds),
                       "build_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    log(f"field built in {result['field']['build_s']} s, {len(seeds)} seeds")

    runs, first = [], None
    for setup in args.setups.split(","):
        blocks, counting = setup.split("+")
        accelerators = set_block_reductions(cp, blocks == "on")
        with cupy_bincount() if counting == "cupy" else contextlib.nullcontext():
            track_connectome(field_, bits, seeds[:2000], ProbParams(n_samples=5), spec, **kw)  # warm-up
            free()
            t1 = time.perf_counter()
            r = track_connectome(field_, bits, seeds, params, spec, timing=True, **kw)
            s = time.perf_counter() - t1
        m = r.matrix3
        same = None
        if first is None:
            first = r
        else:
            same = bool(np.array_equal(first.paths, r.paths) and np.array_equal(first.waytotal, r.waytotal)
                        and all(np.array_equal(getattr(first.matrix3, k), getattr(m, k)) for k in ("rows", "cols", "counts")))  # fmt: skip
        row = {"setup": setup, "reduction_accelerators": accelerators, "streamlines": r.streamlines, "s": round(s, 2),
               "streamlines_per_s": round(r.streamlines / s), "phases_s": r.provenance["phases_s"],
               "reductions": r.provenance["reductions"], "chunk_streamlines": r.provenance["chunk_streamlines"],
               "matrix3_nonzeros": m.nnz, "matrix3_total_count": int(m.counts.sum()), "same_counts_as_first": same,
               "peak_device_pool_bytes": r.provenance["peak_device_pool_bytes"]}  # fmt: skip
        log(f"{setup}: {r.streamlines / 1e6:.1f} M in {s:.2f} s, phases {row['phases_s']}, same {same}")
        runs.append(row)
        del r
        free()
    set_block_reductions(cp, any(a in (1, "cub") for a in result["reduction_accelerators_at_start"]))
    result["runs"] = runs
    text = json.dumps(result, indent=2)
    table = markdown(result)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".md").write_text(table + "\n")
    return 0


def markdown(result: dict) -> str:
    lines = [f"# omatrix3 A/B on {result['device']} (CuPy {result['cupy']})", "", f"`{result['command']}`", ""]
    if result.get("micro"):
        lines += ["| CUB block reductions | n | (x<0).any() s | min+max s | cupy.bincount s | engine s | cupy weighted s | engine weighted s |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in result["micro"]:
            lines.append(f"| {'on' if r['block_reductions'] else 'off'} | {r['n']:,} | {r['any_s']} | {r['min_max_s']} | "
                         f"{r['cupy_bincount_s']} | {r['engine_bincount_s']} | {r['cupy_bincount_weighted_s']} | "
                         f"{r['engine_bincount_weighted_s']} |")  # fmt: skip
        lines.append("")
    lines += ["| set-up | streamlines | s | streamlines/s | visits | paths | entries | reduce | result | same counts |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result.get("runs", []):
        p = r["phases_s"]
        lines.append(f"| {r['setup']} | {r['streamlines']:,} | {r['s']} | {r['streamlines_per_s']:,} | {p['visits']} | "
                     f"{p['paths']} | {p['entries']} | {p['reduce']} | {p['result']} | "
                     f"{'(first)' if r['same_counts_as_first'] is None else r['same_counts_as_first']} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
