"""The CPU resampler's two paths on threads: an atlas's labels (nearest) and a T1 (trilinear) drawn
on a 1 mm subject grid through an affine and a smooth displacement field on a 2 mm grid, as
``tractlens atlas`` and ``apply-transform`` do after a SyN registration (issue "Anatomy and atlases").

For each thread count and slab size: the NumPy path (:mod:`gpu.resample_host`) and numba's compiled
loop (:mod:`gpu.resample_loops`, already started: its start is timed once, in a fresh process), the
seconds of the resampling alone (best of ``--repeat``), and whether both give the same bits. What it
is for: the rule that picks the path (``COMPILED_START_SAMPLES``, ``NUMPY_THREADS``) and the slab
size (``SLAB_SAMPLES``) were measured on 2 cores; this shows how the NumPy path's threads scale on
more (the Python share of each slab holds the GIL). Usage::

    python tests/benchmarks/bench_resample_threads.py                       # 1, 2, 4, ... all cores
    python tests/benchmarks/bench_resample_threads.py --threads 16 --slabs 32768,131072 --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy import ndimage

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tractlens.gpu.resample as engine  # noqa: E402
import tractlens.gpu.resample_host as host  # noqa: E402
from tractlens.app.atlases import load_atlas, load_template  # noqa: E402


def the_case():
    """The atlas (harvard-oxford-cortical), the template as the T1, and a subject 1 mm grid's voxel map:
    a small rotation, scaling and shift, plus a smooth field of up to 5 mm on a 2 mm grid."""
    labels, atlas_affine, _ = load_atlas("harvard-oxford-cortical")
    t1, t1_affine = load_template("mni")
    shape = t1.shape  # the subject grid: 182 x 218 x 182 at 1 mm
    angle = np.deg2rad(4.0)
    rotation = np.array([[1, 0, 0], [0, np.cos(angle), -np.sin(angle)], [0, np.sin(angle), np.cos(angle)]])
    ras = np.eye(4)
    ras[:3, :3] = rotation @ np.diag([1.04, 0.97, 1.02])
    ras[:3, 3] = [3.0, -2.0, 2.0]
    field_shape = tuple(-(-n // 2) for n in shape)
    rng = np.random.default_rng(7)
    zoom = np.array(field_shape) / (12, 14, 12)
    field = np.stack([ndimage.zoom(rng.normal(size=(12, 14, 12)), zoom, order=1) for _ in range(3)], -1)
    field = (5.0 * field / np.abs(field).max()).astype(np.float32)
    field_affine = t1_affine @ np.diag([2.0, 2.0, 2.0, 1.0])
    out_to_ras = t1_affine
    maps = {}
    for name, (source, source_affine) in {"labels": (labels, atlas_affine), "t1": (t1, t1_affine)}.items():
        maps[name] = (
            source,
            np.linalg.inv(source_affine) @ ras @ out_to_ras,  # linear: output voxel -> source voxel
            field,
            np.linalg.inv(field_affine) @ out_to_ras,  # at_field: output voxel -> field voxel
            np.linalg.inv(source_affine)[:3, :3] @ ras[:3, :3],  # step: RAS mm -> source voxels
        )
    return shape, maps


def timed(path: str, threads: int, order: int, shape, case, repeat: int) -> tuple[float, np.ndarray]:
    source, linear, field, at, step = case
    compiled = path == "numba"
    engine.COMPILED_START_SAMPLES = {0: 0, 1: 0} if compiled else {0: 1 << 62, 1: 1 << 62}
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = engine.resample_volume(source, shape, linear, field, at, step, order=order, threads=threads)
        best = min(best, time.perf_counter() - t0)
    return best, out


def numba_start_seconds() -> float | None:
    """numba's start in a fresh process: import, the loop from its cache, one empty call."""
    code = (
        "import time, numpy as np; import tractlens.gpu.resample as r; "
        "r.COMPILED_START_SAMPLES = {0: 0, 1: 0}; t = time.perf_counter(); "
        "r.resample_volume(np.zeros((2, 2, 2), np.float32), (1, 1, 1), np.eye(4), threads=1); "
        "print(time.perf_counter() - t)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    return float(done.stdout.split()[-1]) if done.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = len(os.sched_getaffinity(0))
    counts = sorted({t for t in (1, 2, 4, 8, 16, 32, 64) if t <= cores} | {cores})
    parser.add_argument("--threads", default=",".join(map(str, counts)))
    parser.add_argument("--slabs", default="32768,65536,131072", help="SLAB_SAMPLES values (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="a JSON file for the rows")
    args = parser.parse_args()
    if engine.numba_module() is None:
        raise SystemExit("numba (the cpu extra) is needed for the comparison")
    start = numba_start_seconds()
    shape, maps = the_case()
    rows = []
    print(f"numba's start in a fresh process: {start:.2f} s" if start else "numba's start: not measured")
    for threads in map(int, args.threads.split(",")):
        for name, order in (("labels", 0), ("t1", 1)):
            loop, reference = timed("numba", threads, order, shape, maps[name], args.repeat)
            for slab in map(int, args.slabs.split(",")):
                host.SLAB_SAMPLES = slab
                arrays, out = timed("numpy", threads, order, shape, maps[name], args.repeat)
                same = bool(np.array_equal(out.view(np.uint8), reference.view(np.uint8)))
                row = {"image": name, "threads": threads, "slab_samples": slab, "numpy_s": round(arrays, 4),
                       "numba_loop_s": round(loop, 4), "same_bits": same}  # fmt: skip
                rows.append(row)
                print(f"{name:6s} {threads:3d} threads, slab {slab:7d}: NumPy {arrays:.3f} s, numba's loop {loop:.3f} s "
                      f"(+ {start or 0:.2f} s start), same bits {same}", flush=True)  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"machine": platform.node(), "cpus": cores, "numba_start_s": start,
                                        "voxels": int(np.prod(shape)), "rows": rows}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
