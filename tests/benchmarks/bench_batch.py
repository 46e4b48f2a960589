"""Benchmark: subjects per hour of ``tractlens batch --pipeline fit-dti,track-deterministic,connectome``
on HCP-sized synthetic subjects, one GPU against the machine's CPU cores, and what Dask adds.

    python tests/benchmarks/bench_batch.py --outdir /scratch/batch --subjects 8 --json
    python tests/benchmarks/bench_batch.py --quick --outdir /tmp/batch-quick        # a small check, anywhere
    python tests/benchmarks/bench_batch.py --no-cpu --gpu-counts 1,2,4 --subjects-per-gpu 3   # GPU scaling

The subject is bench_e2e.py's (145×174×145 voxels of 1.25 mm, 288 volumes, float32 ``dwi.nii``,
three crossing bundles; made once into ``--outdir`` and reused), with a parcellation of the brain
into blocks of a 4×4×4 grid for the connectome. The BIDS dataset links every ``sub-NN`` to that one
subject (the same bytes; the page cache holds them after the first read, as it would a fast
file system's), so ``--subjects N`` costs no disk.

Measured, each engine in a fresh process as a user runs it:

* ``plain``: the three single-subject commands one after the other, each its own process, on the
  engine's device: seconds per subject.
* ``batch``: ``tractlens batch`` over N subjects — ``--gpus n`` for each n of ``--gpu-counts`` up
  to the GPUs here (``--subjects-per-gpu`` × n subjects each when given; ``gpu_scaling``: subjects
  per hour against n × the 1-GPU rate, with and without the cluster's start) and
  ``--workers W`` on the CPU (W = ``--cpu-workers``, default the cores, at most one per 12 GB of
  memory: a subject's fit holds ~5 GB) — wall time, subjects per hour, and the per-subject
  overhead: worker-seconds per subject in the batch (wall × workers / N) minus the plain
  commands' seconds per subject, also as a percentage of the latter (issue 28's target: < 5 %);
  and the same once the cluster is up (its start, a one-off per run, taken out).
  The plain commands each pay an interpreter start and imports that a batch worker pays once,
  so the overhead can come out negative.

Results: ``<results>/batch_<gpu>[_quick].json`` and ``.md``; ``--json`` prints the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import bench_e2e  # noqa: E402  (the HCP-sized subject maker)

PIPELINE = "fit-dti,track-deterministic,connectome"
GRID = 4  # the parcellation: blocks of a GRID×GRID×GRID grid over the volume, inside the brain


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def make_subject(spec, folder: Path, workers: int) -> Path:
    """The DWI (bench_e2e's), its bval/bvec and a block parcellation, made once."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "subject.json"
    wanted = {"spec": asdict(spec), "grid": GRID}
    if manifest.exists() and json.loads(manifest.read_text()) == json.loads(json.dumps(wanted)):
        return folder
    mask = bench_e2e.brain_mask(spec)
    start = time.perf_counter()
    bench_e2e.write_dwi(spec, mask, folder, workers)
    blocks = np.indices(spec.shape) * GRID // np.array(spec.shape)[:, None, None, None]
    labels = np.where(mask, 1 + blocks[0] * GRID * GRID + blocks[1] * GRID + blocks[2], 0).astype(np.int16)
    import nibabel as nib

    nib.save(nib.Nifti1Image(labels, bench_e2e.affine(spec)), folder / "labels.nii.gz")
    manifest.write_text(json.dumps(wanted))
    log(f"made the subject in {time.perf_counter() - start:.1f} s")
    return folder


def make_bids(subject: Path, root: Path, n: int) -> Path:
    """``root/sub-01..N/dwi/sub-NN_dwi.{nii,bval,bvec}`` linking to the one subject."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "dataset_description.json").write_text(json.dumps({"Name": "bench", "BIDSVersion": "1.9.0"}))
    dwi = next(subject.glob("dwi.nii*"))
    ext = "nii.gz" if dwi.name.endswith(".gz") else "nii"
    for i in range(1, n + 1):
        folder = root / f"sub-{i:02d}" / "dwi"
        folder.mkdir(parents=True)
        for source, suffix in ((dwi, ext), (subject / "dwi.bval", "bval"), (subject / "dwi.bvec", "bvec")):
            (folder / f"sub-{i:02d}_dwi.{suffix}").symlink_to(source)
    return root


def cli(argv: list[str], env: dict, timeout_s: float) -> tuple[float, dict | None, str]:
    """Run ``python -m tractlens.app.cli ARGV --json --quiet``: wall seconds, summary, stderr tail."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tractlens.app.cli", *argv, "--json", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=timeout_s, cwd=ROOT)  # fmt: skip
    wall = time.perf_counter() - start
    try:
        summary = json.loads(done.stdout)
    except ValueError:
        summary = None
    if done.returncode not in (0,):
        log(f"  exit {done.returncode}: {' '.join(argv[:3])} ...\n{done.stderr[-1500:]}")
    return wall, summary, done.stderr[-1500:]


def plain_commands(subject: Path, out: Path, device: str, env: dict, timeout_s: float) -> dict:
    """The three commands as a user types them for one subject: seconds each and in all."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    dwi = next(subject.glob("dwi.nii*"))
    steps = {
        "fit-dti": ["fit-dti", str(dwi), "-o", str(out / "dti"), "--device", device],
        "track-deterministic": ["track", "deterministic", "--tensor", str(out / "dti"),  # fit-dti's dtifit folder
                                "--whole-brain", "-o", str(out / "det.trx"), "--device", device],
        "connectome": ["connectome", str(out / "det.trx"), "--labels", str(subject / "labels.nii.gz"),
                       "-o", str(out / "matrix.csv"), "--device", device],
    }  # fmt: skip
    seconds = {}
    for name, argv in steps.items():
        wall, summary, stderr = cli(argv, env, timeout_s)
        if summary is None:  # a failed command times nothing: no comparison is made from it
            raise RuntimeError(f"the plain command {name} failed on {device}:\n{stderr}")
        seconds[name] = round(wall, 3)
        log(f"  plain {name} on {device}: {seconds[name]:.1f} s")
    return {"seconds": seconds, "per_subject_s": round(sum(seconds.values()), 3)}


def batch_run(bids: Path, out: Path, config: Path, engine: list[str], env: dict, timeout_s: float) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    argv = ["batch", str(bids), "-o", str(out), "--pipeline", PIPELINE, "--config", str(config), *engine]
    wall, summary, stderr = cli(argv, env, timeout_s)
    row = {"argv": ["tractlens", *argv], "wall_s": round(wall, 3)}
    if summary is None:
        return {**row, "error": stderr}
    row.update(counts=summary["counts"], step_seconds=summary["step_seconds"], failed=summary["failed"],
               cluster_start_s=summary["cluster_start_s"], batch_wall_s=summary["wall_s"])  # fmt: skip
    row["tasks"] = [task_row(entry) for entry in summary.get("done", [])]
    row["per_step"] = per_step(row["tasks"])
    return row


def task_row(entry: dict) -> dict:
    """One subject-step of a batch run: where it ran (the worker's GPU, process, threads), its
    seconds, and how they split (the command; moving its outputs into place; the command's own
    read / compute / write phases and its peak host memory)."""
    timing = entry.get("timing") or {}
    phases = timing.get("phases") or {}
    worker = entry.get("worker") or {}
    return {"step": entry.get("step"), "subject": entry.get("subject"), "gpu": worker.get("gpu"),
            "pid": worker.get("pid"), "threads": worker.get("threads"), "cpus": worker.get("cpus"),
            "seconds": entry.get("seconds"),
            "command_s": timing.get("command_s"), "move_s": timing.get("move_s"), "clean_s": timing.get("clean_s"),
            "durable_s": timing.get("durable_s"),
            "phases_s": phases.get("phases_s", {}), "unattributed_s": phases.get("unattributed_s"),
            "host_peak_rss_bytes": phases.get("host_peak_rss_bytes"), "cpu_s": phases.get("cpu_s"),
            "writer_s": (phases.get("details_s") or {}).get("tractogram_writer", {})}  # fmt: skip


def per_step(tasks: list[dict]) -> dict:
    """Per step: the mean seconds of a subject, of its command and of each of the command's
    phases, over all subjects and per GPU (so a phase that grows with the number of workers shows)."""

    def mean(values):
        values = [v for v in values if v is not None]
        return round(sum(values) / len(values), 3) if values else None

    out = {}
    for step in dict.fromkeys(t["step"] for t in tasks):
        mine = [t for t in tasks if t["step"] == step]
        phases = sorted({p for t in mine for p in t["phases_s"]})
        out[step] = {
            "subjects": len(mine),
            "seconds": mean([t["seconds"] for t in mine]),
            "max_seconds": max(t["seconds"] or 0 for t in mine),
            "command_s": mean([t["command_s"] for t in mine]),
            "move_s": mean([t["move_s"] for t in mine]),
            "durable_s": mean([t.get("durable_s") for t in mine]),  # flushed after the step, on its own thread
            "phases_s": {p: mean([t["phases_s"].get(p) for t in mine]) for p in phases},
            "unattributed_s": mean([t["unattributed_s"] for t in mine]),
            "cpu_s": mean([t.get("cpu_s") for t in mine]),  # the worker's CPU seconds in the command
            "writer_s": {
                k: mean([t.get("writer_s", {}).get(k) for t in mine])
                for k in sorted({k for t in mine for k in t.get("writer_s", {})})
            },
            "per_gpu_seconds": {
                str(g): mean([t["seconds"] for t in mine if t["gpu"] == g])
                for g in sorted({t["gpu"] for t in mine}, key=str)
            },
        }
    return out


def gpu_count() -> int:
    """GPUs here (nvidia-smi); 0 without. ``batch --gpus N`` uses dask-cuda where installed, else
    a LocalCluster with one worker process pinned to each GPU (app.batch.engines)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return len([line for line in done.stdout.splitlines() if line.strip()]) if done.returncode == 0 else 0


def gpu_cluster_kind() -> str:
    try:
        import dask_cuda  # noqa: F401
    except ImportError:
        return "distributed.LocalCluster, one worker process pinned to each GPU (no dask-cuda here)"
    return "dask_cuda.LocalCUDACluster"


def scaling(rows: list[dict]) -> list[dict]:
    """Subjects per hour of each GPU count against N × the 1-GPU rate (the wall time with the
    cluster's start, and without it); with ``--repeat``, the median of the rounds' rates (each
    round's own in ``rounds``)."""

    def rates(row):
        subjects = row["batch"]["counts"]["done"] / 3
        return (
            subjects,
            row["subjects_per_hour"],
            subjects * 3600 / (row["batch"]["batch_wall_s"] - row["cluster_start_s"]),
        )

    gpu: dict[int, list[tuple]] = {}
    for row in rows:
        if row["engine"].startswith("gpu") and "subjects_per_hour" in row:
            gpu.setdefault(row["workers"], []).append(rates(row))
    if 1 not in gpu:
        return []
    _, one, one_running = (statistics.median(v) for v in zip(*gpu[1], strict=True))
    out = []
    for n, runs in sorted(gpu.items()):
        subjects, hourly, running = (statistics.median(v) for v in zip(*runs, strict=True))
        out.append({"gpus": n, "subjects": subjects, "subjects_per_hour": round(hourly, 2),
                    "efficiency": round(hourly / (n * one), 3),
                    "subjects_per_hour_once_started": round(running, 2),
                    "efficiency_once_started": round(running / (n * one_running), 3),
                    "rounds": [round(r[1], 2) for r in runs],
                    # each round against the same round of one GPU (interleaved: the host's state alike)
                    "round_efficiency": [round(r[1] / (n * o[1]), 3) for r, o in zip(runs, gpu[1], strict=False)]})  # fmt: skip
    return out


def default_cpu_workers() -> int:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(os.cpu_count() or 1, int(memory // (12 * 2**30))))


def summarise_engine(name: str, plain: dict | None, batch: dict, subjects: int, workers: int) -> dict:
    if "error" in batch:
        return {"engine": name, "plain": plain, "batch": batch}
    if plain is None:  # --no-plain: throughput only
        return {"engine": name, "workers": workers, "plain": None, "batch": batch,
                "subjects_per_hour": round(subjects * 3600 / batch["wall_s"], 2), "cluster_start_s": batch["cluster_start_s"]}  # fmt: skip
    per_worker_subject = batch["wall_s"] * workers / subjects
    overhead = per_worker_subject - plain["per_subject_s"]
    running = (batch["batch_wall_s"] - batch["cluster_start_s"]) * workers / subjects  # once the workers are up
    return {
        "engine": name,
        "workers": workers,
        "plain": plain,
        "batch": batch,
        "subjects_per_hour": round(subjects * 3600 / batch["wall_s"], 2),
        "worker_seconds_per_subject": round(per_worker_subject, 3),
        "overhead_per_subject_s": round(overhead, 3),
        "overhead_percent": round(100 * overhead / plain["per_subject_s"], 2),
        "cluster_start_s": batch["cluster_start_s"],
        "overhead_after_start_s": round(running - plain["per_subject_s"], 3),
        "overhead_after_start_percent": round(100 * (running - plain["per_subject_s"]) / plain["per_subject_s"], 2),
    }


def markdown(results: dict) -> str:
    lines = [
        f"# tractlens batch: {PIPELINE} ({results['subject_summary']})",
        "",
        f"{results['subjects']} subjects per run, on {results['device']}"
        + (
            f"; {results['workers_per_gpu']} worker processes per GPU."
            if results.get("workers_per_gpu", 1) > 1
            else "."
        ),
        "",
        "| engine | workers | batch wall (s) | cluster start (s) | subjects/hour | plain s/subject "
        "| batch worker-s/subject | overhead | overhead once started |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["engines"]:
        if "subjects_per_hour" not in row:
            lines.append(f"| {row['engine']} | | failed | | | | | | |")
            continue
        if row.get("plain") is None:
            lines.append(f"| {row['engine']} | {row['workers']} | {row['batch']['wall_s']:.1f} | "
                         f"{row['cluster_start_s']:.1f} | {row['subjects_per_hour']:.1f} | | | | |")  # fmt: skip
            continue
        lines.append(
            f"| {row['engine']} | {row['workers']} | {row['batch']['wall_s']:.1f} | {row['cluster_start_s']:.1f} | "
            f"{row['subjects_per_hour']:.1f} | {row['plain']['per_subject_s']:.1f} | "
            f"{row['worker_seconds_per_subject']:.1f} | "
            f"{row['overhead_per_subject_s']:+.1f} s ({row['overhead_percent']:+.1f} %) | "
            f"{row['overhead_after_start_s']:+.1f} s ({row['overhead_after_start_percent']:+.1f} %) |"
        )
    if results.get("gpu_scaling"):
        lines += ["", f"GPU scaling (medians of {results.get('repeat', 1)} round(s); output folder {results.get('outdir', '')}; "
                  f"warm-up: {(results.get('warmup') or {}).get('wall_s', 'none')}):", "",
                  "| GPUs | subjects/hour | efficiency | once started | efficiency once started | rounds "
                  "| efficiency by round |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for g in results["gpu_scaling"]:
            lines.append(f"| {g['gpus']} | {g['subjects_per_hour']} | {g['efficiency']} | "
                         f"{g['subjects_per_hour_once_started']} | {g['efficiency_once_started']} | "
                         f"{', '.join(map(str, g.get('rounds', [])))} "
                         f"| {', '.join(map(str, g.get('round_efficiency', [])))} |")  # fmt: skip
    for row in results["engines"]:
        steps = (row.get("batch") or {}).get("per_step")
        if not steps:
            continue
        lines += ["", f"{row['engine']}: seconds per subject-step (mean over subjects; the command's own phases)", "",
                  "| step | subject | command | read | compute | write | other in command | move into place "
                  "| CPU s (all threads) | flushed after (s) | per GPU |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for step, r in steps.items():
            ph = r["phases_s"]
            gpus = ", ".join(f"{g}: {v}" for g, v in r["per_gpu_seconds"].items())
            lines.append(f"| {step} | {r['seconds']} | {r['command_s']} | {ph.get('read', '')} | "
                         f"{ph.get('compute', '')} | {ph.get('write', '')} | {r['unattributed_s']} | {r['move_s']} "
                         f"| {r.get('cpu_s') if r.get('cpu_s') is not None else ''} "
                         f"| {r.get('durable_s') if r.get('durable_s') is not None else ''} | {gpus} |")  # fmt: skip
        writers = {step: r["writer_s"] for step, r in steps.items() if r.get("writer_s")}
        if writers:  # the tractogram writer's thread: its stages overlap the phases above
            lines += ["", "Tractogram writer's thread, seconds per subject-step (points to RAS mm; into the file; "
                      "at close; to the disk and renamed):", ""]  # fmt: skip
            lines += [f"- {step}: " + ", ".join(f"{k} {v}" for k, v in w.items()) for step, w in writers.items()]
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outdir", type=Path, default=Path("/tmp/tractlens-batch-bench"), help="subject and outputs")
    p.add_argument("--subjects", type=int, help="subjects per batch run (default 8; --quick: 3)")
    p.add_argument("--quick", action="store_true", help="bench_e2e's small subject (24×28×24), for checking the script")
    p.add_argument("--cpu-workers", type=int, help="worker processes of the CPU run (default: cores, ≤ 1 per 12 GB)")
    p.add_argument("--no-gpu", action="store_true", help="the CPU engine only")
    p.add_argument("--gpu-counts", default="1,2,4", help="batch --gpus N for each N (up to the GPUs here)")
    p.add_argument("--workers-per-gpu", type=int, default=1,
                   help="batch --workers-per-gpu K for every --gpus run (K worker processes share each GPU)")  # fmt: skip
    p.add_argument("--subjects-per-gpu", type=int, default=0,
                   help="subjects per GPU of each --gpus run (N × this; default: --subjects for every run)")  # fmt: skip
    p.add_argument("--no-cpu", action="store_true",
                   help="the GPU engine only (a CPU run of HCP-sized subjects takes tens of minutes)")  # fmt: skip
    p.add_argument("--no-plain", action="store_true",
                   help="skip the single-subject commands (no overhead figures; subjects per hour and steps only)")  # fmt: skip
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of the GPU counts, interleaved (1,2,4,1,2,4...); the scaling takes each count's median")  # fmt: skip
    p.add_argument("--warmup", action="store_true",
                   help="first an untimed batch of one subject on one GPU (the DWI read once, the kernels built, "
                        "host memory touched), so the first timed run does not pay for the machine's start")  # fmt: skip
    p.add_argument(
        "--keep-outputs", action="store_true", help="keep each run's derivatives (default: removed after it)"
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one batch run may take")
    p.add_argument("--results", type=Path, default=HERE / "results", help="folder of batch_<gpu>.json/.md")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = bench_e2e.QUICK if args.quick else bench_e2e.SubjectSpec()
    subjects = args.subjects or (3 if args.quick else 8)
    subject = make_subject(spec, args.outdir / "subject", os.cpu_count() or 1)
    bids = make_bids(subject, args.outdir / "bids", subjects)
    config = args.outdir / "params.toml"
    config.write_text(f'[connectome]\nlabels = "{subject / "labels.nii.gz"}"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["NCCL_NVLS_ENABLE"] = "0"
    engines = []
    gpus_here = 0 if args.no_gpu else gpu_count()
    counts = [n for n in (int(v) for v in args.gpu_counts.split(",")) if 1 <= n <= gpus_here]
    for round_ in range(1, max(1, args.repeat) + 1):
        for n in counts:
            name = (f"gpu×{n}" if n > 1 else "gpu") + (f" r{round_}" if args.repeat > 1 else "")
            per_gpu = ["--workers-per-gpu", str(args.workers_per_gpu)] if args.workers_per_gpu > 1 else []
            engines.append((name, "gpu", ["--gpus", str(n), *per_gpu], n))
    cpu_workers = args.cpu_workers or (2 if args.quick else default_cpu_workers())
    if not args.no_cpu:
        engines.append(("cpu", "cpu", ["--workers", str(cpu_workers)], cpu_workers))
    rows, plains, warmup = [], {}, None
    if args.warmup and counts:
        log("warm-up: tractlens batch --gpus 1 over one subject (not timed)")
        out = args.outdir / "derivatives_warmup"
        warm = batch_run(make_bids(subject, args.outdir / "bids_1", 1), out, config, ["--gpus", "1"], env,
                         args.timeout)  # fmt: skip
        warmup = {"wall_s": warm.get("wall_s"), "error": warm.get("error")}
        shutil.rmtree(out, ignore_errors=True)
    for name, device, engine, workers in engines:
        count = args.subjects_per_gpu * workers if device == "gpu" and args.subjects_per_gpu else subjects
        root = bids if count == subjects else make_bids(subject, args.outdir / f"bids_{count}", count)
        log(f"{name}: the plain commands, then tractlens batch {' '.join(engine)} over {count} subjects")
        if args.no_plain:
            plains[device] = None
        elif device not in plains:  # one subject's plain commands per device
            plains[device] = plain_commands(subject, args.outdir / f"plain_{device}", device, env, args.timeout)
        out = args.outdir / f"derivatives_{name.replace(' ', '_')}"
        batch = batch_run(root, out, config, engine, env, args.timeout)
        if not args.keep_outputs:  # the disk and the page cache as the next run found them before
            shutil.rmtree(out, ignore_errors=True)
        rows.append(summarise_engine(name, plains[device], batch, count, workers))
        log(f"  batch on {name}: {batch.get('wall_s')} s, {rows[-1].get('subjects_per_hour')} subjects/hour")
    from tractlens.app.batch.engines import worker_threads_environ

    tag = bench_e2e.gpu_tag() + ("_quick" if args.quick else "")
    results = {
        "device": tag,
        "pipeline": PIPELINE,
        "subjects": subjects,
        "subject_summary": f"{'×'.join(map(str, spec.shape))} voxels, {spec.n_volumes} volumes",
        "cpu_count": os.cpu_count(),
        "worker_threads": {str(n): worker_threads_environ(n) for n in (1, 2, 4, 8)},
        "gpu_cluster": gpu_cluster_kind() if gpus_here else None,
        "engines": rows,
        "gpu_scaling": scaling(rows),
        "repeat": args.repeat,
        "workers_per_gpu": args.workers_per_gpu,
        "warmup": warmup,
        "outdir": str(args.outdir),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    target = args.results / f"batch_{tag}"
    target.with_suffix(".json").write_text(json.dumps(results, indent=2))
    target.with_suffix(".md").write_text(markdown(results))
    print(json.dumps(results, indent=2) if args.json else markdown(results))
    failed = any("subjects_per_hour" not in row or row["batch"]["counts"]["failed"] for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
