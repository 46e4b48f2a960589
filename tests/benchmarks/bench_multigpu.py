"""Several GPUs of one host, measured in one invocation (issue "Several GPUs"):

1. ``prob``: ``track probabilistic --gpus n`` for n = 1 … N on bench_e2e.py's HCP-sized subject
   (145×174×145 voxels, 1.02 M brain voxels, bedpostX samples), every brain voxel seeding
   ``--nsamples`` streamlines (100: 102 M), each run a fresh process after a warm-up run (the
   bedpostX cache and the kernel cache filled): the whole command, its tracking time, each
   device's stages (start, upload, setup, compute, finish) and the merge, and whether every
   output byte equals the 1-GPU run's; then the split run in this process for each count (1
   included: its stages where the command uses no split).
2. ``omatrix3``: the dense connectome (probtrackx defaults, the brain's outermost voxel layer as
   seeds and target3) on 1 GPU and on N, in this process: identical counts checked on
   ``--omatrix3-check`` streamlines, the 1-GPU rate on ``--omatrix3-one`` (its time for the
   N-GPU count extrapolated), the N-GPU run on ``--omatrix3-streamlines`` (500 M).
3. ``commit``: COMMIT's operator split by voxel rows: a problem that fits one GPU on 1 and N
   GPUs (A x + Aᵀ y per iteration, the weights after a short FISTA run compared), and the
   large case (``--commit-big-streamlines``, 10 M × 400 segments: 4 G segments) on N only,
   with the time per iteration and the memory of each device. The problems are synthetic, made
   on their devices (:mod:`multigpu_parts`).

``NCCL_NVLS_ENABLE=0`` is set for everything this script starts (NVLink multicast off). The
results go to ``--out`` (default ``tests/benchmarks/results/multigpu_<gpu>x<N>.json``), written
after each part, with the commands that made them. Usage (4 GPUs, about 5 minutes)::

    python tests/benchmarks/bench_multigpu.py
    python tests/benchmarks/bench_multigpu.py --parts prob --gpus 1,2    # a part, some counts
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run_cli(argv: list[str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tractlens.app.cli", *argv, "--json", "--quiet"],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"tractlens {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
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
    """A hash of every NIfTI the run wrote (the visitation counts) and waytotal, in name order."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.nii*")) + sorted(folder.glob("waytotal*")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def make_subject(subject: Path, quick: bool = False) -> None:
    if not (subject / "subject.json").is_file():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(HERE / "bench_e2e.py"), "--outdir", str(subject), "--make-only",
                        *(["--quick"] if quick else [])], check=True, cwd=ROOT)  # fmt: skip
        log(f"subject made in {time.perf_counter() - t0:.0f} s")


def probabilistic(subject: Path, counts: list[int], nsamples: int) -> dict:
    base = ["track", "probabilistic", "--samples", str(subject / "bedpostx"), "--seed", str(subject / "mask.nii.gz"),
            "--nsamples", str(nsamples)]  # fmt: skip
    warm_base = [*base[:-1], "2"]  # the bedpostX cache and the kernel cache filled, few streamlines
    warm, _ = run_cli([*warm_base, "-o", str(subject / "prob_warmup")])
    run_cli([*warm_base, "--gpus", str(max(counts)), "-o", str(subject / "prob_warmup_n")])
    log(f"prob: warm-up run {warm:.1f} s")
    rows, reference = [], None
    for n in counts:
        out = subject / f"prob_gpus{n}"
        seconds, summary = run_cli([*base, "--gpus", str(n), "-o", str(out)])
        row = {"gpus": n, "command": "tractlens " + " ".join([*base, "--gpus", str(n), "-o", str(out)]),
               "whole_s": round(seconds, 2), "streamlines": find(summary, "streamlines"),
               "tracking_s": find(summary, "tracking_s"), "merge_s": summary.get("merge_s"),
               "devices": summary.get("devices"), "notes": summary.get("notes"),
               "device_pool_peak_bytes": summary.get("device_pool_peak_bytes"),
               "timings": summary.get("timings", {}), "digest": digest(out)}  # fmt: skip
        from multigpu_parts import attribute

        row["attribution"] = attribute(row["devices"], row["tracking_s"], row["merge_s"])
        reference = reference or row["digest"]
        row["same_as_first"] = row["digest"] == reference
        log(f"prob on {n} GPU(s): whole {row['whole_s']} s, tracking {row['tracking_s']:.2f} s, "
            f"same {row['same_as_first']}")  # fmt: skip
        rows.append(row)
    one = rows[0]
    for row in rows:
        row["speedup_whole"] = round(one["whole_s"] / row["whole_s"], 3)
        if one.get("tracking_s") and row.get("tracking_s"):
            row["speedup_tracking"] = round(one["tracking_s"] / row["tracking_s"], 3)
            row["efficiency_tracking"] = round(row["speedup_tracking"] / (row["gpus"] / one["gpus"]), 3)
    return {"nsamples": nsamples, "rows": rows}


def markdown(result: dict) -> str:
    """The results as the tables of docs/multigpu.md."""
    lines = [f"# Several GPUs: {result['gpus_here']} × {result['gpu'].upper()}", "", f"`{result['command']}`", ""]
    if "prob" in result:
        lines += ["| GPUs | whole command (s) | tracking (s) | speed-up | efficiency | merge (s) | same counts |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in result["prob"]["rows"]:
            lines.append(f"| {r['gpus']} | {r['whole_s']} | {r['tracking_s']:.2f} | {r.get('speedup_tracking', '')} | "
                         f"{r.get('efficiency_tracking', '')} | {r.get('merge_s') or ''} | {r['same_as_first']} |")  # fmt: skip
        lines.append("")
        lines += _attribution_table("command", result["prob"]["rows"])
        if result["prob"].get("in_process"):
            lines += _attribution_table("in this process (lanes: streams per GPU)", result["prob"]["in_process"])
        if result["prob"].get("schedules"):
            lines += _schedule_table(result["prob"]["schedules"])
    if "omatrix3" in result:
        o = result["omatrix3"]
        lines += ["| omatrix3 | streamlines | s | streamlines/s |", "|---|---|---|---|",
                  f"| 1 GPU | {o['one_gpu']['streamlines']:,} | {o['one_gpu']['s']} | {o['one_gpu']['streamlines_per_s']:,} |",
                  f"| {o['n_gpus']['gpus']} GPUs | {o['n_gpus']['streamlines']:,} | {o['n_gpus']['s']} | "
                  f"{o['n_gpus']['streamlines_per_s']:,} |", "",
                  f"Identical counts 1 vs N: {o['check']['identical_1_vs_n']}; speed-up {o['speedup']} "
                  f"(efficiency {o['efficiency']}).", ""]  # fmt: skip
    if "commit" in result:
        lines += ["| COMMIT | GPUs | segments | s per iteration | pool peak per device (GB) |", "|---|---|---|---|---|"]
        for name, case in result["commit"].items():
            for key in ("one_gpu", "n_gpus"):
                if key in case:
                    r = case[key]
                    peaks = ", ".join(f"{v / 1e9:.1f}" for v in r["pool_peak_bytes_per_device"].values())
                    gpus = 1 if key == "one_gpu" else case["gpus"]
                    lines.append(f"| {name} | {gpus} | {case['segments']:,} | {r['s_per_iteration']} | {peaks} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _schedule_table(s: dict) -> list[str]:
    """The split's chunk schedule against one GPU's batches (multigpu_parts.prob_schedules)."""
    cost = s.get("chunk_cost") or {}
    lines = [f"One GPU in this process: iter_track {s['iter_track_1gpu_s']} s (field already on the GPU), the "
             f"split's compute {s['split_1gpu_compute_s']} s in {s['split_1gpu_chunks']} chunks. A launch costs "
             f"{cost.get('per_launch_s')} s beyond its streamlines ({cost.get('streamlines_per_s')} streamlines/s, "
             f"{cost.get('chunks')} one-lane chunks).", "",
             f"The split on {s['gpus']} GPUs by smallest chunk:", "",
             "| lanes | smallest chunk | tracking | compute max | ready max | end spread | chunks per device "
             "| same counts |", "|" + "---|" * 8]  # fmt: skip
    for r in s["runs"]:
        lines.append(f"| {r['lanes']} | {r['smallest']:,} | {r['tracking_s']:.3f} | {r['compute_max_s']:.3f} | "
                     f"{r['ready_max_s']:.3f} | {r['end_spread_s']:.3f} | {r['chunks']} | {r['same_as_one_gpu']} |")  # fmt: skip
    return [*lines, ""]


def _attribution_table(title: str, rows: list[dict]) -> list[str]:
    """Where each split run's tracking time went (slowest device; seconds): its opening (its part of
    the upload, waiting for and copying the other parts, the set-up, waiting for the field), its
    compute, the spread of the devices' ends, its finish, the merge and what lies outside them."""
    if not any(r.get("attribution") for r in rows):
        return []
    lines = [f"Tracking time, {title}, per device max (mean):", "",
             "| GPUs | lanes | tracking | efficiency | ready | upload | gather wait | gather | setup | field wait "
             "| compute | end spread | finish | merge | outside |", "|" + "---|" * 15]  # fmt: skip

    def cell(values):
        values = [v for v in values if v is not None]
        return f"{max(values):.3f} ({sum(values) / len(values):.3f})" if values else ""

    for r in rows:
        a = r.get("attribution")
        if not a:
            continue
        lines.append(f"| {r['gpus']} | {r.get('lanes', '')} | {a['tracking_s']:.3f} | "
                     f"{r.get('efficiency', r.get('efficiency_tracking', ''))} | {cell(a['ready_s'])} | "
                     f"{cell(a['upload_s'])} | {cell(a['gather_wait_s'])} | {cell(a['gather_s'])} | "
                     f"{cell(a['setup_s'])} | {cell(a['field_wait_s'])} | {cell(a['compute_s'])} | "
                     f"{a['end_spread_s']:.3f} | {cell(a['finish_s'])} | {a['merge_s']} | {a['outside_s']:.3f} |")  # fmt: skip
    return [*lines, ""]


def gpu_model() -> tuple[str, int]:
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    names = [n for n in done.stdout.splitlines() if n.strip()]
    import re

    match = re.search(r"\b([A-Z]+\d{2,4}[A-Z]?)\b", names[0]) if names else None
    return (match.group(1).lower() if match else "gpu"), len(names)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="prob,omatrix3,commit", help="which parts (default: all three)")
    p.add_argument("--gpus", help="GPU counts of the probabilistic part (default 1,2,4 up to the GPUs here)")
    p.add_argument("--subject", type=Path, default=Path("/tmp/tractlens-e2e"))
    p.add_argument("--nsamples", type=int, default=100, help="probabilistic: streamlines per brain voxel (102 M)")
    p.add_argument("--omatrix3-streamlines", type=float, default=5e8)
    p.add_argument("--omatrix3-one", type=float, default=1.25e8, help="streamlines of the 1-GPU omatrix3 run")
    p.add_argument("--omatrix3-check", type=float, default=1e7, help="streamlines of the 1 vs N equality run")
    p.add_argument("--commit-small-streamlines", type=float, default=1e6)
    p.add_argument("--commit-small-segments", type=int, default=120, help="segments per streamline (small case)")
    p.add_argument("--commit-big-streamlines", type=float,
                   help="the large case (default 10 M on 4 GPUs, 2.5 M per GPU on fewer)")  # fmt: skip
    p.add_argument("--commit-big-segments", type=int, default=400, help="segments per streamline (large case)")
    p.add_argument("--commit-measurements", type=int, default=288, help="measurements per voxel (HCP: 288)")
    p.add_argument("--commit-iterations", type=int, default=3, help="timed iterations (A x + Aᵀ y)")
    p.add_argument("--commit-fit-iterations", type=int, default=20, help="FISTA iterations of the comparison")
    p.add_argument("--out", type=Path)
    p.add_argument("--smoke", action="store_true",
                   help="a check of the script without a GPU: simulated GPUs on the CPU, bench_e2e's small subject, "
                   "tiny sizes; the probabilistic split in this process only (not its commands)")  # fmt: skip
    args = p.parse_args(argv)
    if args.smoke:
        args.subject = args.subject.with_name(args.subject.name + "-quick")
        args.omatrix3_streamlines, args.omatrix3_one, args.omatrix3_check = 4000, 2000, 2000
        args.commit_small_streamlines, args.commit_small_segments = 240, 6
        args.commit_big_streamlines, args.commit_big_segments = 480, 8
        args.commit_measurements, args.commit_fit_iterations = 20, 5
    model, n_here = ("smoke", 2) if args.smoke else gpu_model()

    def backends(n: int):
        from tractlens.gpu.backend import gpu_backends
        from tractlens.gpu.multidevice import simulated_backends

        return simulated_backends(n) if args.smoke else gpu_backends(n)

    counts = [int(v) for v in args.gpus.split(",")] if args.gpus else [n for n in (1, 2, 4, 8) if n <= n_here]
    n_max = max(counts)
    out = args.out or HERE / "results" / f"multigpu_{model}x{n_here}.json"
    parts = args.parts.split(",")
    result = {"command": "python tests/benchmarks/bench_multigpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "gpus_here": n_here, "gpu": model, "environment": {"NCCL_NVLS_ENABLE": os.environ["NCCL_NVLS_ENABLE"]}}  # fmt: skip

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        try:
            out.with_suffix(".md").write_text(markdown(result))
        except (KeyError, TypeError, ValueError) as exc:  # a part that failed half-way: the JSON says what
            log(f"no table: {exc!r}")

    failed = False
    started = time.perf_counter()
    for part in parts:
        t0 = time.perf_counter()
        try:
            if part in ("prob", "omatrix3"):
                make_subject(args.subject, args.smoke)
            if part == "prob":
                from multigpu_parts import prob_stages

                if args.smoke:  # the commands need real GPUs: the split in this process only
                    result["prob"] = {"nsamples": 1, "rows": []}
                    result["prob"]["in_process"] = prob_stages(args.subject, counts, 1, backends, log)
                else:
                    result["prob"] = probabilistic(args.subject, counts, args.nsamples)
                    save()
                    result["prob"]["in_process"] = prob_stages(args.subject, counts, args.nsamples, backends, log)
                save()
                if n_max > 1:  # the schedule against one GPU's batches, and the smallest chunk swept
                    from multigpu_parts import prob_schedules

                    result["prob"]["schedules"] = prob_schedules(args.subject, n_max, 1 if args.smoke else args.nsamples,
                                                                 backends, log)  # fmt: skip
            elif part == "omatrix3":
                from multigpu_parts import omatrix3

                result["omatrix3"] = omatrix3(args.subject, backends(n_max), args.omatrix3_streamlines,
                                              args.omatrix3_one, args.omatrix3_check, log)  # fmt: skip
            elif part == "commit":
                from multigpu_parts import commit_case

                small = commit_case(backends(n_max), int(args.commit_small_streamlines), args.commit_small_segments,
                                    args.commit_measurements, args.commit_iterations, args.commit_fit_iterations,
                                    True, log)  # fmt: skip
                result["commit"] = {"fits_one_gpu": small}
                save()
                big_n = int(args.commit_big_streamlines or (1e7 if n_max >= 4 else 2.5e6 * n_max))
                result["commit"]["large"] = commit_case(backends(n_max), big_n, args.commit_big_segments,
                                                        args.commit_measurements, args.commit_iterations, 0, False,
                                                        log)  # fmt: skip
            else:
                raise ValueError(f"unknown part {part}")
        except Exception as exc:
            failed = True
            result.setdefault("errors", {})[part] = "".join(traceback.format_exception(exc))[-4000:]
            log(f"{part} failed: {exc}")
        result.setdefault("part_seconds", {})[part] = round(time.perf_counter() - t0, 1)
        save()
    result["total_s"] = round(time.perf_counter() - started, 1)
    save()
    print(json.dumps(result, indent=2)[:20000])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
