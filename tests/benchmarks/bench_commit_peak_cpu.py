"""Benchmark: peak host memory of a whole ``commit`` command on the CPU engine (issue 42's 8 GB target).

    python tests/benchmarks/bench_commit_peak_cpu.py --dwi /tmp/e2e/dwi.nii \
        --tractogram /tmp/e2e/runs/track-det_s1/tracks.trx --max-iter 2 --out commit_peak_cpu_h100.json
    # the former EC compartments (one per distinct orientation of the segments) for comparison:
    python tests/benchmarks/bench_commit_peak_cpu.py ... --commit-args "--ec-orientations 0" --out ...

Runs ``python -m tractlens.app.cli commit --device cpu`` in a fresh process and polls its
``/proc/PID/status`` every 0.1 s: the peak of ``VmRSS`` (all resident pages), of ``RssAnon`` (the
job's own heap: what a laptop must find free) and of ``RssFile`` (pages of the memory-mapped DWI
and tractogram, which the page cache can drop), plus ``ru_maxrss`` of the child at its end. The
fit's iterations are capped (``--max-iter``): the peak is reached when the operator is built and
FISTA's vectors exist, so more iterations add time, not memory. The command's own JSON summary
(segments, streamlines, voxels, EC compartments, cut passes, and the memory guard's announced need
``host_memory_announced_bytes`` with its parts) is kept in the result, and the peak is printed
against the announcement and the 8 GB target.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def _status_kb(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dwi", required=True)
    p.add_argument("--tractogram", required=True)
    p.add_argument("--max-iter", type=int, default=2)
    p.add_argument("--work", default="/tmp/commit_peak_cpu")
    p.add_argument("--out", required=True)
    p.add_argument("--commit-args", default="", help="more options of tractlens commit, one string")
    args = p.parse_args(argv)
    cmd = [
        sys.executable,
        "-m",
        "tractlens.app.cli",
        "commit",
        "--dwi",
        args.dwi,
        "--tractogram",
        args.tractogram,
        "-o",
        args.work,
        "--device",
        "cpu",
        "--max-iter",
        str(args.max_iter),
        "--json",
        "--quiet",
        *args.commit_args.split(),
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak: dict[str, int] = {}
    while proc.poll() is None:
        for key, kb in _status_kb(proc.pid).items():
            peak[key] = max(peak.get(key, 0), kb)
        time.sleep(0.1)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    summary = None
    try:
        summary = json.loads(stdout)
    except json.JSONDecodeError:
        pass
    result = {
        "command": " ".join(cmd),
        "bench_command": " ".join([sys.executable, *sys.argv]),
        "returncode": proc.returncode,
        "wall_s": round(wall, 2),
        "cores": os.cpu_count(),
        "peak_bytes": {k: v * 1024 for k, v in peak.items()},
        "ru_maxrss_children_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "summary": summary,
        "stderr_tail": stderr[-3000:],
    }
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    gb = {k: round(v / 1e9, 2) for k, v in result["peak_bytes"].items()}
    print(
        f"commit --device cpu: rc {proc.returncode}, {wall:.1f} s, peak GB {gb}, ru_maxrss "
        f"{result['ru_maxrss_children_bytes'] / 1e9:.2f} GB"
    )
    if summary:
        announced = summary.get("host_memory_announced_bytes")
        print(
            f"segments {summary.get('segments'):,}, voxels {summary.get('voxels'):,}, EC compartments "
            f"{summary.get('ec_compartments'):,}, cut passes {summary.get('cut_passes')}; announced "
            f"{announced / 1e9 if announced else float('nan'):.2f} GB; VmRSS peak "
            f"{result['peak_bytes'].get('VmRSS', 0) / 1e9:.2f} GB (target 8 GB)"
        )
        parts = summary.get("host_memory_parts") or {}
        if "fit, counted" in parts:  # the guard's two announcements: estimated before the cut, counted after it
            print(
                f"announced before the cut {parts['announced before the cut'] / 1e9:.2f} GB, the fit with the "
                f"counted EC compartments {parts['fit, counted'] / 1e9:.2f} GB; RssAnon peak "
                f"{result['peak_bytes'].get('RssAnon', 0) / 1e9:.2f} GB"
            )
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
