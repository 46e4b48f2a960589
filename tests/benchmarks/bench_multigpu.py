"""Probabilistic tracking on 1, 2 and 4 GPUs of one host: the whole command and its tracking time,
and whether every count is the same as on one GPU (issue "Several GPUs").

The subject is bench_e2e.py's HCP-sized one (145×174×145 voxels, 1.02 M brain voxels, bedpostX
samples); every brain voxel seeds ``--nsamples`` streamlines (100: 102 M streamlines). Each run is
``python -m tractlens.app.cli track probabilistic ... --gpus N`` in a fresh process, after one
warm-up run that fills the bedpostX cache and the kernel cache. Usage::

    python tests/benchmarks/bench_multigpu.py --gpus 1,2,4 --out tests/benchmarks/results/multigpu_<machine>.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tractlens.app.cli", *argv, "--json", "--quiet"],
                          capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"tractlens {' '.join(argv)} failed:\n{done.stderr}")
    return seconds, json.loads(done.stdout)


def find(summary, key: str):
    """The first value of ``key`` anywhere in the (nested) summary."""
    if isinstance(summary, dict):
        if key in summary:
            return summary[key]
        for value in summary.values():
            found = find(value, key)
            if found is not None:
                return found
    return None


def digest(folder: Path) -> str:
    """A hash of every NIfTI the run wrote (the visitation counts and waytotal), in name order."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.nii*")) + sorted(folder.glob("waytotal*")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subject", type=Path, default=Path("/tmp/tractlens-e2e"))
    parser.add_argument("--gpus", default="1,2,4")
    parser.add_argument("--nsamples", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not (args.subject / "subject.json").is_file():
        subprocess.run([sys.executable, str(ROOT / "tests/benchmarks/bench_e2e.py"), "--outdir", str(args.subject),
                        "--make-only"], check=True)  # fmt: skip
    base = ["track", "probabilistic", "--samples", str(args.subject / "bedpostx"), "--seed",
            str(args.subject / "mask.nii.gz"), "--nsamples", str(args.nsamples)]  # fmt: skip
    run([*base, "-o", str(args.subject / "prob_warmup")])
    rows, reference = [], None
    for n in [int(v) for v in args.gpus.split(",")]:
        out = args.subject / f"prob_gpus{n}"
        seconds, summary = run([*base, "--gpus", str(n), "-o", str(out)])
        timings = summary.get("timings", {})
        row = {"gpus": n, "whole_s": round(seconds, 2), "streamlines": find(summary, "streamlines"),
               "tracking_s": find(summary, "tracking_s"), "timings": timings,
               "digest": digest(out)}  # fmt: skip
        reference = reference or row["digest"]
        row["same_as_first"] = row["digest"] == reference
        print(json.dumps(row), flush=True)
        rows.append(row)
    one = rows[0]
    for row in rows:
        row["speedup_whole"] = round(one["whole_s"] / row["whole_s"], 3)
        if one.get("tracking_s") and row.get("tracking_s"):
            row["speedup_tracking"] = round(one["tracking_s"] / row["tracking_s"], 3)
            row["efficiency_tracking"] = round(row["speedup_tracking"] / (row["gpus"] / one["gpus"]), 3)
    result = {"rows": rows, "command": "python tests/benchmarks/bench_multigpu.py " + " ".join(sys.argv[1:])}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
