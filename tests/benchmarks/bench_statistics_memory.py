"""Benchmark: host memory of a whole-brain selection's statistics (the Statistics tab's job).

    python tests/benchmarks/bench_statistics_memory.py [--streamlines 1000000] [--selected 120000]
        [--threads 16] [--rounds 2] [--label L] [--out FILE]

The synthetic tractogram of ``bench_render.py`` (``--streamlines`` of 100 points, written once
into ``--cache``) is opened as the window opens it (memory-mapped, its positions check left out),
a random ``--selected`` of its streamlines is shown, and :func:`app.statistics.tract_statistics`
measures them ``--rounds`` times on ``--threads`` host threads (``TRACTLENS_THREADS``, as a
16-core machine gives). Recorded: the anonymous resident memory before and after (what the
allocator kept), and the peak resident memory over the rounds (VmHWM, reset first), in MB.

To compare two trees, run each tree's copy of the script (``cd TREE && python
tests/benchmarks/bench_statistics_memory.py --label TREE``): one JSON line per run is appended
to ``--out`` (default ``results/statistics_memory_<host>.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def status_kb(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streamlines", type=int, default=1_000_000)
    parser.add_argument("--selected", type=int, default=120_000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("TRACTLENS_BENCH_CACHE", "/tmp/tractlens-bench"))
    )
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ["TRACTLENS_THREADS"] = str(args.threads)

    import tractlens.app
    import tractlens.app.statistics as statistics
    from tests.benchmarks.bench_render import synthetic_trx
    from tractlens.app.io import load_tractogram

    args.cache.mkdir(parents=True, exist_ok=True)
    tract = load_tractogram(synthetic_trx(args.cache, args.streamlines), check_positions=False)
    shown = np.zeros(len(tract), dtype=bool)
    shown[np.random.default_rng(0).choice(len(tract), min(args.selected, len(tract)), replace=False)] = True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here (Linux 4.0+)
        reset = True
    except OSError:
        reset = False
    before = status_kb("RssAnon")
    start = time.perf_counter()
    for _ in range(args.rounds):
        statistics.tract_statistics(tract, shown)
    out = {
        "label": args.label,
        "tree": str(Path(tractlens.app.__file__).resolve().parent.parent),
        "block_points": statistics.BLOCK_POINTS,
        "streamlines": len(tract),
        "selected": int(shown.sum()),
        "threads": args.threads,
        "rounds": args.rounds,
        "seconds_per_round": round((time.perf_counter() - start) / args.rounds, 2),
        "anon_before_mb": before // 1024,
        "anon_after_mb": status_kb("RssAnon") // 1024,
        "peak_mb": status_kb("VmHWM") // 1024 if reset else None,
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(out))
    path = args.out or ROOT / "tests" / "benchmarks" / "results" / f"statistics_memory_{socket.gethostname()}.jsonl"
    with open(path, "a") as handle:
        handle.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
