"""Benchmark: where the GPU starts to win, per method, cold and warm — the constants of
``device="auto"``'s cost model (:data:`tractlens.gpu.engines.DEFAULT_COSTS`).

    python tests/benchmarks/bench_crossover.py                  # everything, ~6-8 min on an H100
    python tests/benchmarks/bench_crossover.py --quick          # smaller sizes, ~2 min
    python tests/benchmarks/bench_crossover.py --methods fit-dti --no-hcp

No Qt is imported (the GPU machine has none): whole commands run as ``python -m tractlens``.

Measured:

* start-up: ``import cupy`` + a first CUDA call in a fresh process, minus an empty interpreter;
* per method, in a fresh process: compiling its kernels with an empty ``CUPY_CACHE_DIR``
  (cold) and loading them from a filled one (cached);
* per method and size, in process, on warm engines: CPU and GPU seconds (median of repeats);
  a least-squares line through them gives seconds per unit and the GPU's fixed overhead;
* whole commands (``tractlens fit-dti``, ``tractlens track deterministic --whole-brain``),
  timed with ``time.perf_counter`` around ``subprocess.run``: ``--device cpu``, ``--device gpu``
  cold (empty cache), ``--device gpu`` cached, and ``--device auto``, at each volume size.

Writes ``results/crossover_<gpu>.json`` and ``results/crossover_<gpu>.md`` (the README's table)
and prints the ``DEFAULT_COSTS`` entries to paste into ``gpu/engines.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).parent / "results"
PYTHON = sys.executable
sys.path.insert(0, str(ROOT))
from tests.benchmarks.crossover_methods import GROUPS, median_time  # noqa: E402

METHODS = ("fit-dti", "deterministic")
#: Whole-command volumes: demo-sized up to the issue's 96×96×64 and HCP's 145×174×145 grid.
VOLUMES = {"small": (32, 32, 20), "demo": (64, 64, 40), "issue": (96, 96, 64), "hcp": (145, 174, 145)}
N_DIRECTIONS = 64  # + 1 b=0: 65 measurements, as in the issue


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def env_with(cache: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if cache is not None:
        env["CUPY_CACHE_DIR"] = cache
    return env


def run_timed(args: list[str], cache: str | None, timeout: float = 240) -> tuple[float, dict | None, str]:
    """Seconds a fresh ``python ...`` takes, its --json summary (when it printed one), stderr."""
    start = time.perf_counter()
    done = subprocess.run(
        [PYTHON, *args], capture_output=True, text=True, env=env_with(cache), timeout=timeout, cwd=ROOT
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-800:]}")
    try:
        summary = json.loads(done.stdout)
    except ValueError:
        summary = None
    return seconds, summary, done.stderr


# ----------------------------------------------------------------------------- synthetic data
def gradients(rng) -> tuple[np.ndarray, np.ndarray]:
    g = rng.normal(size=(N_DIRECTIONS, 3))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    return np.r_[0.0, np.full(N_DIRECTIONS, 1000.0)], np.r_[[[0, 0, 0]], g]


def tensor_field(shape, rng) -> np.ndarray:
    """(X, Y, Z, 6) tensors (xx, xy, xz, yy, yz, zz, mm²/s): fibres curving in the x-y plane, FA ~0.7."""
    x, y = np.meshgrid(np.linspace(0, np.pi, shape[0]), np.linspace(0, np.pi, shape[1]), indexing="ij")
    angle = np.broadcast_to((0.6 * np.sin(x + y))[..., None], shape)
    e1 = np.stack([np.cos(angle), np.sin(angle), 0.1 * np.ones(shape)], -1)
    e1 /= np.linalg.norm(e1, axis=-1, keepdims=True)
    d = 0.4e-3 * np.eye(3) + 1.3e-3 * e1[..., :, None] * e1[..., None, :]
    return np.stack([d[..., 0, 0], d[..., 0, 1], d[..., 0, 2], d[..., 1, 1], d[..., 1, 2], d[..., 2, 2]], -1)


def dwi_signal(tensor: np.ndarray, bvals, bvecs, rng) -> np.ndarray:
    t = tensor
    q = (
        t[..., None, 0] * bvecs[:, 0] ** 2 + t[..., None, 3] * bvecs[:, 1] ** 2 + t[..., None, 5] * bvecs[:, 2] ** 2
        + 2 * (t[..., None, 1] * bvecs[:, 0] * bvecs[:, 1] + t[..., None, 2] * bvecs[:, 0] * bvecs[:, 2]
               + t[..., None, 4] * bvecs[:, 1] * bvecs[:, 2])
    )  # fmt: skip
    s = 1000.0 * np.exp(-bvals * q)
    return (s + rng.normal(scale=20.0, size=s.shape)).astype(np.float32)


def write_volume(folder: Path, shape, rng) -> dict:
    import nibabel as nib

    folder.mkdir(parents=True, exist_ok=True)
    bvals, bvecs = gradients(rng)
    data = np.zeros((*shape, len(bvals)), np.float32)
    tensors = tensor_field(shape, rng)  # once: per slab it made writing the HCP grid quadratic in Z
    for z in range(shape[2]):  # slab by slab: the HCP grid's float64 signal would need GBs at once
        data[:, :, z] = dwi_signal(tensors[:, :, z], bvals, bvecs, rng)
    del tensors
    nib.save(nib.Nifti1Image(data, np.diag([2.0, 2.0, 2.0, 1.0])), folder / "dwi.nii")
    np.savetxt(folder / "dwi.bval", bvals[None], fmt="%g")
    np.savetxt(folder / "dwi.bvec", bvecs.T, fmt="%.6f")
    return {"dwi": str(folder / "dwi.nii"), "bval": str(folder / "dwi.bval"), "bvec": str(folder / "dwi.bvec")}


# ----------------------------------------------------------------------------- fresh processes
STARTUP = """
import time; t = time.perf_counter()
import cupy
(cupy.arange(4, dtype=cupy.float32) * 2).sum().item()
print(time.perf_counter() - t)
"""

COMPILE = """
import json, sys, time
import cupy
(cupy.arange(4, dtype=cupy.float32) * 2).sum().item()
from tractlens.gpu import warmup
out = {}
for b in warmup.catalogue():
    t = time.perf_counter(); b.compile(); cupy.cuda.Device().synchronize()
    out[b.method] = out.get(b.method, 0.0) + time.perf_counter() - t
print(json.dumps(out))
"""


def measure_startup(repeats: int) -> float:
    times = []
    for _ in range(repeats):
        done = subprocess.run([PYTHON, "-c", STARTUP], capture_output=True, text=True, env=env_with(None))
        times.append(float(done.stdout.strip()))
    return statistics.median(times)


def measure_compile(cache: str) -> dict:
    done = subprocess.run([PYTHON, "-c", COMPILE], capture_output=True, text=True, env=env_with(cache), timeout=400)
    if done.returncode:
        raise RuntimeError(done.stderr[-800:])
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- in process, warm
def inprocess_dti(sizes, repeats, rng) -> list[dict]:
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.dti import fit_dti

    bvals, bvecs = gradients(rng)
    gpu = get_backend("gpu")
    rows = []
    for n in sizes:
        tensors = tensor_field((n, 1, 1), rng).reshape(n, 6)
        signal = dwi_signal(tensors, bvals, bvecs, rng)
        units = n * len(bvals)
        cpu = median_time(lambda s=signal: fit_dti(s, bvals, bvecs, device="cpu"), repeats)
        gpu_s = median_time(lambda s=signal: fit_dti(s, bvals, bvecs, device=gpu), repeats, gpu.synchronize)
        rows.append({"method": "fit-dti", "units": units, "voxels": n, "cpu_s": cpu, "gpu_s": gpu_s})
        log(f"  fit-dti {n:>9} voxels: cpu {cpu:.4f} s, gpu {gpu_s:.4f} s")
    return rows


def inprocess_deterministic(sizes, repeats, rng) -> list[dict]:
    from tractlens.gpu import deterministic
    from tractlens.gpu.backend import get_backend

    shape = (96, 96, 64)
    tensor = tensor_field(shape, rng)
    params = deterministic.DeterministicParams()
    gpu = get_backend("gpu")
    steps = params.max_length_mm / params.step_mm
    rows = []
    for n in sizes:
        seeds = rng.uniform([2, 2, 2], np.array(shape) - 3, size=(n, 3))

        def run(device, seeds=seeds):
            return list(deterministic.track(tensor, seeds, params, voxel_size=(2.0, 2.0, 2.0), device=device))

        # the CPU takes ~0.7 ms per seed here: one run of the larger sizes is enough
        cpu = median_time(lambda: run("cpu"), repeats if n < 10_000 else 1)
        gpu_s = median_time(lambda: run(gpu), repeats, gpu.synchronize)
        rows.append({"method": "deterministic", "units": n * steps, "seeds": n, "cpu_s": cpu, "gpu_s": gpu_s})
        log(f"  deterministic {n:>8} seeds: cpu {cpu:.4f} s, gpu {gpu_s:.4f} s")
    return rows


def fit_line(units, seconds) -> tuple[float, float]:
    """Least squares ``seconds ≈ intercept + slope · units`` (both clipped at >= 0)."""
    slope, intercept = np.polyfit(np.asarray(units, float), np.asarray(seconds, float), 1)
    return max(float(slope), 0.0), max(float(intercept), 0.0)


# ----------------------------------------------------------------------------- whole commands
def command(method: str, files: dict, device: str, out: Path) -> list[str]:
    base = ["-m", "tractlens"]
    if method == "fit-dti":
        return [*base, "fit-dti", files["dwi"], "--bval", files["bval"], "--bvec", files["bvec"], "-o", str(out),
                "--device", device, "--json", "--quiet"]  # fmt: skip
    return [*base, "track", "deterministic", "--dwi", files["dwi"], "--bval", files["bval"], "--bvec", files["bvec"],
            "--whole-brain", "-o", str(out / "t.trk"), "--device", device, "--json", "--quiet"]  # fmt: skip


def work_units(method: str, summary: dict | None) -> float | None:
    """The size the command passed to ``decide_device``, from its ``--json`` summary."""
    if not summary:
        return None
    if method == "fit-dti":
        return float(summary["voxels_fitted"] * summary["volumes"])
    steps = summary["parameters"]["max_length_mm"] / summary["parameters"]["step_mm"]
    return float(summary["seeds"] * steps)


def whole_commands(methods, volumes, work: Path, rng, det_volumes=("small", "demo")) -> list[dict]:
    rows = []
    filled = tempfile.mkdtemp(prefix="cupy-cache-filled-")
    run_timed(["-m", "tractlens", "info", "--compile", "--quiet"], filled)
    for label, shape in volumes.items():
        log(f"writing the {label} volume {shape}")
        t = time.perf_counter()
        files = write_volume(work / label, shape, rng)
        log(f"  written in {time.perf_counter() - t:.1f} s")
        for method in methods:
            if method == "deterministic" and label not in det_volumes:
                continue  # the CPU would track for many minutes
            row = {"method": method, "volume": label, "shape": list(shape)}
            for mode, device, cache in (
                ("cpu", "cpu", filled),
                ("gpu_cold", "gpu", None),
                ("gpu_cached", "gpu", filled),
                ("auto", "auto", filled),
            ):
                cold = tempfile.mkdtemp(prefix="cupy-cache-empty-") if cache is None else None
                out = work / f"out-{label}-{method}-{mode}"
                out.mkdir(exist_ok=True)
                try:
                    seconds, summary, stderr = run_timed(command(method, files, device, out), cache or cold)
                    row[f"{mode}_s"] = seconds
                    if mode == "cpu":
                        row["units"] = work_units(method, summary)
                    if mode == "auto" and summary:
                        row["auto_choice"] = summary.get("device_choice")
                    if mode == "gpu_cold":
                        row["said_compiling"] = "compiling GPU kernels" in stderr
                except Exception as exc:  # keep going: one failure must not lose the rest
                    row[f"{mode}_error"] = str(exc)[-300:]
                finally:
                    if cold:
                        shutil.rmtree(cold, ignore_errors=True)
                    shutil.rmtree(out, ignore_errors=True)
            log(f"  {method} {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k.endswith("_s")))
            rows.append(row)
    shutil.rmtree(filled, ignore_errors=True)
    return rows


# ----------------------------------------------------------------------------- report
def constants(startup_s, compile_cold, compile_cached, inprocess) -> dict:
    out = {}
    for method in sorted({r["method"] for r in inprocess}):
        rows = [r for r in inprocess if r["method"] == method]
        a, _ = fit_line([r["units"] for r in rows], [r["cpu_s"] for r in rows])
        b, overhead = fit_line([r["units"] for r in rows], [r["gpu_s"] for r in rows])
        out[method] = {
            "cpu_s_per_unit": a,
            "gpu_s_per_unit": b,
            "gpu_overhead_s": overhead,
            "compile_s": compile_cold.get(method, 0.0),
            "load_s": compile_cached.get(method, 0.0),
        }
    return {"import_s": startup_s, "methods": out}


def command_fit(commands: list[dict], startup_s, compile_cold, compile_cached) -> dict:
    """Per method, a line through the whole commands' time differences: ``cpu - gpu`` ≈
    ``gain · units - start``; ``start`` is the GPU's effective start-up in a command (what the
    model should charge), ``gain`` the per-unit advantage of the whole GPU pipeline."""
    out = {}
    for method in sorted({r["method"] for r in commands}):
        rows = [r for r in commands if r["method"] == method and r.get("units") and "cpu_s" in r]
        fit = {}
        for mode in ("gpu_cached", "gpu_cold"):
            pts = [(r["units"], r["cpu_s"] - r[f"{mode}_s"]) for r in rows if f"{mode}_s" in r]
            if len(pts) < 2:
                continue
            gain, intercept = np.polyfit(*np.asarray(pts, float).T, 1)
            fit[mode] = {
                "gain_s_per_unit": float(gain),
                "start_s": float(-intercept),
                "crossover": float(-intercept / gain) if gain > 0 else float("inf"),
            }
        out[method] = fit
    return out


def crossover(c: dict, method: str, startup: float) -> float:
    m = c["methods"][method]
    gain = m["cpu_s_per_unit"] - m["gpu_s_per_unit"]
    return float("inf") if gain <= 0 else (startup + m["gpu_overhead_s"]) / gain


def markdown(c: dict, commands: list[dict], gpu_name: str) -> str:
    lines = [
        f"Measured on {gpu_name} by `tests/benchmarks/bench_crossover.py`. Crossover: the work size above which "
        "the GPU is faster (cold: fresh process, empty kernel cache; cached: fresh process, kernels on disk; "
        "warm: kernels loaded in the process, e.g. after the window's warm-up).",
        "",
        "| method | unit | crossover cold | crossover cached | crossover warm |",
        "|---|---|---|---|---|",
    ]
    from tractlens.gpu.engines import DEFAULT_COSTS

    units = {name: cost.unit for name, cost in DEFAULT_COSTS.methods.items()}
    for method, m in c["methods"].items():
        cold = crossover(c, method, c["import_s"] + m["compile_s"])
        cached = crossover(c, method, c["import_s"] + m["load_s"])
        warm = crossover(c, method, 0.0)
        lines.append(f"| {method} | {units.get(method, '')} | {cold:.3g} | {cached:.3g} | {warm:.3g} |")
    lines += [
        "",
        "| command | volume | cpu (s) | gpu cold (s) | gpu cached (s) | auto (s) | auto chose |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in commands:
        cells = [f"{r.get(k, float('nan')):.2f}" for k in ("cpu_s", "gpu_cold_s", "gpu_cached_s", "auto_s")]
        choice = (r.get("auto_choice") or "").replace("|", "/")
        lines.append(f"| {r['method']} | {r['volume']} {tuple(r['shape'])} | {' | '.join(cells)} | {choice} |")
    fits = c.get("commands") or {}
    if fits:
        lines += [
            "",
            "Whole commands, a line through cpu − gpu: the GPU's effective start-up and the crossover.",
            "",
            "| method | mode | gain (s per unit) | effective start-up (s) | crossover (units) |",
            "|---|---|---|---|---|",
        ]
        for method, modes in fits.items():
            for mode, f in modes.items():
                lines.append(
                    f"| {method} | {mode} | {f['gain_s_per_unit']:.3g} | {f['start_s']:.2f} | {f['crossover']:.3g} |"
                )
    return "\n".join(lines) + "\n"


def python_constants(c: dict) -> str:
    lines = [f"import_s={c['import_s']:.3g}"]
    for method, m in c["methods"].items():
        lines.append(
            f'"{method}": MethodCost(unit, {m["cpu_s_per_unit"]:.3g}, {m["gpu_s_per_unit"]:.3g}, '
            f"gpu_overhead_s={m['gpu_overhead_s']:.3g}, compile_s={m['compile_s']:.3g}, load_s={m['load_s']:.3g}, ...)"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--volumes", nargs="+", default=list(VOLUMES), choices=list(VOLUMES))
    parser.add_argument("--no-hcp", action="store_true", help="leave out the HCP-sized volume")
    parser.add_argument("--no-commands", action="store_true", help="in-process measurements only")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats, no HCP volume")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--groups", nargs="*", default=[], choices=list(GROUPS),
        help="in-process rows of the other methods too (crossover_methods.py)",
    )  # fmt: skip
    parser.add_argument("--det-volumes", nargs="+", default=["small", "demo"], choices=list(VOLUMES))
    parser.add_argument("--tag", default="", help="suffix of the result files (runs split over several calls)")
    args = parser.parse_args()
    if "PySide6" in sys.modules:
        raise SystemExit("this benchmark must not import Qt")
    rng = np.random.default_rng(0)
    t_all = time.perf_counter()
    volumes = {k: VOLUMES[k] for k in args.volumes if not ((args.no_hcp or args.quick) and k == "hcp")}
    repeats = 1 if args.quick else args.repeats

    from tractlens.gpu.backend import gpu_status

    ok, gpu_name = gpu_status()
    if not ok:
        raise SystemExit(f"no usable GPU: {gpu_name}")
    log(f"GPU: {gpu_name}")
    startup = measure_startup(1 if args.quick else 3)
    log(f"import cupy + first CUDA call: {startup:.2f} s")
    cold_cache = tempfile.mkdtemp(prefix="cupy-cache-empty-")
    compile_cold = measure_compile(cold_cache)
    compile_cached = measure_compile(cold_cache)  # the same folder, now filled
    shutil.rmtree(cold_cache, ignore_errors=True)
    log(f"compile cold: { {k: round(v, 2) for k, v in compile_cold.items()} }")
    log(f"load cached: { {k: round(v, 3) for k, v in compile_cached.items()} }")

    inprocess = []
    if "fit-dti" in args.methods:
        sizes = [1_000, 10_000, 100_000] + ([] if args.quick else [400_000, 1_000_000])
        inprocess += inprocess_dti(sizes, repeats, rng)
    if "deterministic" in args.methods:
        sizes = [100, 1_000, 10_000] + ([] if args.quick else [30_000])
        inprocess += inprocess_deterministic(sizes, repeats, rng)
    for group in args.groups:
        fn, sizes, quick_sizes = GROUPS[group]
        try:
            inprocess += fn(quick_sizes if args.quick else sizes, repeats, log)
        except Exception as exc:  # one method's failure must not lose the others' rows
            log(f"  {group} failed: {type(exc).__name__}: {exc}")
    c = constants(startup, compile_cold, compile_cached, inprocess)

    commands = []
    if not args.no_commands:
        with tempfile.TemporaryDirectory(prefix="bench-crossover-") as work:
            commands = whole_commands(args.methods, volumes, Path(work), rng, args.det_volumes)
    c["commands"] = command_fit(commands, startup, compile_cold, compile_cached)

    slug = re.sub(r"[^a-z0-9]+", "_", gpu_name.lower()).strip("_")
    slug = "h100" if "h100" in slug else slug
    RESULTS.mkdir(exist_ok=True)
    result = {"gpu": gpu_name, "constants": c, "inprocess": inprocess, "commands": commands,
              "compile_cold_s": compile_cold, "load_cached_s": compile_cached,
              "total_s": time.perf_counter() - t_all}  # fmt: skip
    slug += f"_{args.tag}" if args.tag else ""
    (RESULTS / f"crossover_{slug}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    table = markdown(c, commands, gpu_name)
    (RESULTS / f"crossover_{slug}.md").write_text(table)
    print(table)
    print("DEFAULT_COSTS constants (gpu/engines.py):\n" + python_constants(c))
    log(f"done in {time.perf_counter() - t_all:.0f} s; results/crossover_{slug}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
