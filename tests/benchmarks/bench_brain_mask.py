"""Benchmark: the brain mask fit-dti computes from b=0 without ``--mask`` (app.masking), its median
filter on one thread (``scipy.ndimage.median_filter`` of the whole volume, as before) against
slabs on this process's threads (:func:`app.masking.median3`), interleaved, on an HCP grid
(145×174×145) with a synthetic head; the masks must be equal.

    python tests/benchmarks/bench_brain_mask.py [--repeats 3] [--threads N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scipy import ndimage

from tractlens.app import masking
from tractlens.gpu.host import host_threads

SHAPE = (145, 174, 145)


def synthetic_b0() -> np.ndarray:
    g = np.indices(SHAPE).astype(np.float32)
    radius = np.sqrt(((g[0] - 72) / 60) ** 2 + ((g[1] - 87) / 72) ** 2 + ((g[2] - 70) / 58) ** 2)
    rng = np.random.default_rng(0)
    b0 = np.where(radius < 1, 800 + 300 * rng.random(SHAPE), 40 * rng.random(SHAPE)).astype(np.float32)
    b0[60:85, 70:100, 60:80] *= 0.3  # ventricles
    return b0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="threads of the slabs (default: host_threads())")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    threads = args.threads or host_threads()
    b0 = synthetic_b0()
    real = masking.median3
    seconds: dict[str, list[float]] = {"one_thread": [], "slabs": []}
    masks = {}
    for _ in range(args.repeats):
        for name, median in (
            ("one_thread", lambda image: ndimage.median_filter(image, size=3)),
            ("slabs", lambda image: real(image, threads)),
        ):
            masking.median3 = median
            try:
                t0 = time.perf_counter()
                masks[name] = masking.brain_mask_from_b0(b0)
                seconds[name].append(time.perf_counter() - t0)
            finally:
                masking.median3 = real
    if not np.array_equal(masks["one_thread"], masks["slabs"]):
        raise SystemExit("the masks differ")
    result = {
        "shape": SHAPE,
        "threads": threads,
        "cores": host_threads(),
        "mask_fraction": round(float(masks["slabs"].mean()), 4),
        "seconds": {k: [round(s, 3) for s in v] for k, v in seconds.items()},
        "median_s": {k: round(statistics.median(v), 3) for k, v in seconds.items()},
    }
    result["ratio_one_thread_over_slabs"] = round(result["median_s"]["one_thread"] / result["median_s"]["slabs"], 2)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
