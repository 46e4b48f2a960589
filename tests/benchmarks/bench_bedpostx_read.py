"""Benchmark: reading a bedpostX folder written by FSL (gzip NIfTI) — first read and cached read.

    python tests/benchmarks/bench_bedpostx_read.py                    # HCP size (1.8 GB folder)
    python tests/benchmarks/bench_bedpostx_read.py --scale 0.5 --json # 1/8 of the voxels

Data: a synthetic HCP-sized folder made once (deterministically) under ``--workdir``:
145 × 174 × 145 voxels (× ``--scale`` per axis), an ellipsoidal brain mask of ~28 % of the
grid (1.02 M voxels at full size), 3 fibres × 50 samples, ``merged_{th,ph,f}{1,2,3}samples.nii.gz``
and ``nodif_brain_mask.nii.gz`` as FSL writes them (float32, gzip; smooth angles per voxel
with small jitter between samples, so they compress like real ones).

Timed, each in a fresh subprocess (so no page of the arrays is shared between runs; the
compressed files are in the page cache, as after a first ``ls``):

* ``first_read_s``: :func:`load_bedpostx` with the cache on and no entry (reads the files,
  writes the entry) — what the first ``track probabilistic`` on an FSL folder pays;
* ``read_no_cache_s``: the same with ``TRACTLENS_BEDPOSTX_CACHE=0`` (reads only);
* ``cached_read_s``: the next run: maps the entry; ``cached_touch_s`` also reads every page.

Also reported: the threads used, the machine's cores, the bytes in and out, and the phase
split of an in-process read profiled with :mod:`cProfile` (``--profile``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

HCP_SHAPE = (145, 174, 145)
N_FIBRES, N_SAMPLES = 3, 50


def make_folder(folder: Path, scale: float, seed: int = 0) -> dict:
    """The synthetic FSL folder (made once per scale; reused when complete)."""
    from tractlens.app.io.bedpostx import save_bedpostx_masked

    shape = tuple(max(8, round(s * scale)) for s in HCP_SHAPE)
    done = folder / ".complete"
    if not done.exists():
        rng = np.random.default_rng(seed)
        grid = np.stack(np.meshgrid(*(np.linspace(-1, 1, s) for s in shape), indexing="ij"), -1)
        mask = (grid**2).sum(-1) < 0.66  # ~28 % of the grid, as an HCP brain mask
        n = int(mask.sum())
        # per voxel a mean direction, per sample a few degrees of jitter (as a posterior)
        base_th = rng.uniform(0, np.pi, (n, N_FIBRES, 1)).astype(np.float32)
        base_ph = rng.uniform(-np.pi, np.pi, (n, N_FIBRES, 1)).astype(np.float32)
        jitter = np.float32(0.05)
        theta = base_th + jitter * rng.standard_normal((n, N_FIBRES, N_SAMPLES), dtype=np.float32)
        phi = base_ph + jitter * rng.standard_normal((n, N_FIBRES, N_SAMPLES), dtype=np.float32)
        f = np.clip(
            rng.uniform(0, 0.6, (n, N_FIBRES, 1)).astype(np.float32)
            + 0.02 * rng.standard_normal((n, N_FIBRES, N_SAMPLES), dtype=np.float32),
            0,
            1,
        )
        affine = np.diag([-1.25, 1.25, 1.25, 1.0])
        save_bedpostx_masked(folder, mask, affine, theta, phi, f)
        done.write_text("ok")
    files = [*sorted(folder.glob("merged_*samples.nii.gz")), folder / "nodif_brain_mask.nii.gz"]
    return {
        "shape": list(shape),
        "samples": N_SAMPLES,
        "fibres": N_FIBRES,
        "compressed_bytes": sum(p.stat().st_size for p in files),
        "array_bytes": 3 * int(np.prod(shape)) * N_FIBRES * N_SAMPLES * 4,
    }


CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from tractlens.app.io import load_bedpostx
t1 = time.perf_counter()
s = load_bedpostx(sys.argv[1], cache=sys.argv[2] == "1")
t2 = time.perf_counter()
if sys.argv[3] == "1":
    total = sum(float(a.sum(dtype="float64")) for a in (s.theta, s.phi, s.f))
t3 = time.perf_counter()
import resource
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"import_s": t1 - t0, "read_s": t2 - t1, "touch_s": t3 - t2,
                  "cpu_s": use.ru_utime + use.ru_stime, "module": __import__("tractlens").__file__,
                  "cached": s.cache_entry is not None,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def run_child(folder: Path, cache: bool, touch: bool, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), "1" if cache else "0", "1" if touch else "0"],
        env=env,
        cwd=folder.parent,  # not the checkout: its tractlens/ would come first on the path
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def warm_page_cache(folder: Path) -> None:
    for path in folder.glob("*.nii.gz"):
        with open(path, "rb") as fh:
            while fh.read(64 << 20):
                pass


def profile_read(folder: Path, top: int = 25) -> str:
    import cProfile
    import io
    import pstats

    from tractlens.app.io import load_bedpostx

    profiler = cProfile.Profile()
    profiler.enable()
    load_bedpostx(folder, cache=False)
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(top)
    return stream.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="grid scale per axis (1 = HCP size)")
    ap.add_argument("--workdir", default=None, help="where the folder and the cache live (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each measurement (the median is reported)")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of one read (cache off)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--tree", default=None, help="run the reads with the tractlens of this checkout (PYTHONPATH)")
    args = ap.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_bedpostx_"))
    folder = work / f"scale{args.scale:g}.bedpostX"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = make_folder(folder, args.scale)
    make_s = time.perf_counter() - t0
    time.sleep(2.1)  # the cache skips files modified in the last 2 s
    warm_page_cache(folder)

    cache_dir = work / "cache"
    env = {**os.environ, "TRACTLENS_CACHE": str(cache_dir), "TRACTLENS_BEDPOSTX_CACHE": "1"}
    if args.tree:  # another checkout's code (e.g. the previous version, for a before/after)
        env["PYTHONPATH"] = str(Path(args.tree).resolve())
    results: dict[str, list[float]] = {"first_read_s": [], "read_no_cache_s": [], "cached_read_s": []}
    cpu: dict[str, list[float]] = {"first_read": [], "no_cache": []}
    touch: list[float] = []
    peaks: dict[str, float] = {}
    for _ in range(args.repeat):
        import shutil

        shutil.rmtree(cache_dir, ignore_errors=True)
        first = run_child(folder, True, False, env)
        results["first_read_s"].append(first["read_s"])
        cached = run_child(folder, True, True, env)
        assert cached["cached"], "the second read did not map the cache"
        results["cached_read_s"].append(cached["read_s"])
        touch.append(cached["touch_s"])
        plain = run_child(folder, False, False, {**env, "TRACTLENS_BEDPOSTX_CACHE": "0"})
        results["read_no_cache_s"].append(plain["read_s"])
        cpu["first_read"].append(first["cpu_s"])
        cpu["no_cache"].append(plain["cpu_s"])
        module = first["module"]
        peaks = {"first_read": first["peak_rss_gb"], "no_cache": plain["peak_rss_gb"]}
    from tractlens.app.io import _gzip
    from tractlens.app.io.bedpostx import _read_threads

    summary = {
        "folder": info,
        "make_s": make_s,
        **{k: float(np.median(v)) for k, v in results.items()},
        "runs": results,
        "cached_touch_s": float(np.median(touch)),
        "peak_rss_gb": peaks,
        "process_cpu_s": {k: float(np.median(v)) for k, v in cpu.items()},
        "code": module,
        "isal": _gzip.fast_gzip_enabled(),
        "threads": _read_threads(9, info["array_bytes"] // 9),
        "cores": len(os.sched_getaffinity(0)),
        "first_read_gb_per_s": info["array_bytes"] / 2**30 / float(np.median(results["read_no_cache_s"])),
    }
    if args.profile:
        print(profile_read(folder), file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for key in ("first_read_s", "read_no_cache_s", "cached_read_s", "cached_touch_s"):
            print(f"{key:>18}: {summary[key]:.2f} s")
        print(f"{'folder':>18}: {info}")
        print(f"{'isal, threads':>18}: {summary['isal']}, {summary['threads']} of {summary['cores']} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
