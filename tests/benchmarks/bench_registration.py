"""Registration accuracy and speed on cases made from the shipped MNI152 template (issue "Anatomy and atlases").

Cases, each with a known true transform:

- ``rigid`` / ``affine``: the 1 mm template as a subject's T1 (moving), and a b=0-like image (tissue
  contrast inverted inside the brain, a smooth bias field, noise) on a 2 mm grid (fixed), the head
  moved by a known rigid (or affine: rigid + scaling + shear) transform. Error: mean distance between
  where the registration and the truth send the fixed image's brain voxels (mm).
- ``syn``: the template deformed by a known smooth nonlinear warp after a small affine, with a bias
  field and noise, as the subject's 1 mm T1 (moving), registered to ``mni``. Reported: the Dice of
  every Harvard-Oxford region larger than 1 cm³ brought to the subject with our transform against
  the true transform (mean and minimum), the mean distance of mapped brain points to the truth, and
  forward-then-inverse distance.
- ``atlas``: ``tractlens atlas harvard-oxford-cortical`` onto the subject (whole command), on each
  ``--device`` (cpu, and gpu where CuPy sees one), the first use (which fills the label-map cache) and
  the next; on the CPU also with numba's compiled loop forced (a comparison: labels are drawn with
  NumPy, which gives the loop's bits without waiting for numba to start).

Every time is a whole ``tractlens`` command in a fresh process (``python -m tractlens.app.cli ...``,
what the ``tractlens`` script runs for a subcommand), the way a user runs it. The cases are made once;
then every command runs with all the machine's cores, and again on 2 of them (``--cores all,2``: the
process pinned to CPUs 0-1 with ``os.sched_setaffinity``, and ``OMP``/``OPENBLAS``/``MKL``/``NUMBA``/
``TRACTLENS_THREADS`` set to 2). Each row names the command line it timed and says whether it met the
issue's target. Usage::

    python tests/benchmarks/bench_registration.py            # writes results/registration_<device>.json
    python tests/benchmarks/bench_registration.py --cores all --cases affine --out /tmp/r.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.anatomy_synth import rigid  # noqa: E402
from tractlens.app.atlases import load_atlas, load_template  # noqa: E402
from tractlens.app.grid import Grid  # noqa: E402
from tractlens.app.io.transforms import load_registration  # noqa: E402
from tractlens.app.registration import resample  # noqa: E402


def grid_points(g: Grid) -> np.ndarray:
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in g.shape], indexing="ij"), -1).reshape(-1, 3)
    return ijk @ g.affine[:3, :3].T + g.affine[:3, 3]


def bias_and_noise(image: np.ndarray, seed: int, noise: float = 0.02) -> np.ndarray:
    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.normal(size=image.shape), 12)
    field = np.exp(0.25 * field / np.abs(field).max())  # ±25 % smooth bias
    return (image * field + rng.normal(0, noise * image.max(), image.shape)).astype(np.float32)


#: The issue's speed targets (whole commands, seconds), and its accuracy targets.
TARGETS = {"rigid": 5.0, "affine": 5.0, "syn": 30.0, "atlas": 2.0}
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "TRACTLENS_THREADS",
)
CORES: list[int] | None = None  # the CPUs the commands run on (None: all), set per pass by main()


def shown(command: list[str]) -> str:
    """The command line as a user types it (temporary paths shortened), with the core limit of the pass."""
    words = ["tractlens", *(Path(w).name if w.startswith(tempfile.gettempdir()) else w for w in command)]
    if CORES is not None:
        cpus = ",".join(map(str, CORES))
        words = [*(f"{v}={len(CORES)}" for v in THREAD_VARIABLES), f"taskset -c {cpus}", *words]
    return " ".join(words)


def run(command: list[str], prelude: str = "") -> tuple[float, str]:
    """One ``tractlens`` command in a fresh process, timed whole. With a core limit the child pins
    itself to those CPUs before it imports anything (NumPy's BLAS then sees them), as taskset would;
    ``prelude`` is Python the child runs first (a comparison's setting)."""
    env = dict(os.environ)
    argv = [sys.executable, "-m", "tractlens.app.cli", *command]
    if CORES is not None or prelude:
        if CORES is not None:
            env.update({v: str(len(CORES)) for v in THREAD_VARIABLES})
        pin = f"os.sched_setaffinity(0, {set(CORES)!r}); " if CORES is not None else ""
        start = (
            f"import os, runpy, sys; {pin}{prelude}"
            f"sys.argv = ['tractlens', *{command!r}]; runpy.run_module('tractlens.app.cli', run_name='__main__')"
        )
        argv = [sys.executable, "-c", start]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"tractlens {' '.join(command)} failed:\n{done.stderr}")
    return seconds, done.stdout


EXTRA: list[str] = []  # more `tractlens register` options (--register-args)


def make_linear(kind: str, folder: Path, template, affine) -> dict:
    """T1 (template, moving) and a b=0-like 2 mm image (fixed) moved by a known transform; the truth."""
    truth = rigid(7, -5, 9, (6.0, -5.0, 4.0))  # fixed RAS -> moving RAS
    if kind == "affine":
        truth = (
            truth
            @ np.diag([1.06, 0.95, 1.03, 1.0])
            @ np.array([[1, 0.04, 0, 0], [0, 1, -0.03, 0], [0.02, 0, 1, 0], [0, 0, 0, 1.0]])
        )
    g = Grid(np.diag([2.0, 2, 2, 1]) @ np.eye(4) + np.array([[0, 0, 0, -90], [0, 0, 0, -126], [0, 0, 0, -72], [0, 0, 0, 0]]),
             (91, 109, 91))  # fmt: skip
    src = Grid(affine, template.shape)
    t1 = resample(template, src, g, lambda p: p @ truth[:3, :3].T + truth[:3, 3], "linear")
    brain = ndimage.binary_fill_holes(t1 > 0.05 * t1.max())
    b0 = np.where(brain, 1.15 * t1.max() - t1, 0)  # CSF bright, white matter dark
    nib.save(nib.Nifti1Image(bias_and_noise(b0, 1), g.affine), folder / f"b0_{kind}.nii.gz")
    if not (folder / "t1.nii.gz").exists():
        nib.save(nib.Nifti1Image(np.asarray(template), affine), folder / "t1.nii.gz")
    return {"kind": kind, "truth": truth, "grid": g, "brain": brain}


def linear_case(case: dict, folder: Path, tag: str) -> dict:
    kind = case["kind"]
    out = folder / f"reg_{kind}_{tag}"
    command = ["register", str(folder / "t1.nii.gz"), str(folder / f"b0_{kind}.nii.gz"), "-o", str(out), "--type", kind,
               "--quiet", "--json", *EXTRA]  # fmt: skip
    seconds, _ = run(command)
    reg = load_registration(out)
    truth = case["truth"]
    pts = grid_points(case["grid"])[case["brain"].ravel()]
    error = np.linalg.norm(reg.fixed_to_moving(pts) - (pts @ truth[:3, :3].T + truth[:3, 3]), axis=1)
    record = json.loads((out / "registration.json").read_text())
    return {"case": f"T1 1 mm -> b=0-like 2 mm, {kind}", "command": shown(command), "seconds": round(seconds, 2),
            "target_seconds": TARGETS[kind], "meets_speed_target": seconds <= TARGETS[kind],
            "stage_seconds": record["seconds"], "mean_error_mm": round(float(error.mean()), 3),
            "max_error_mm": round(float(error.max()), 3), "target_mean_error_mm": 0.5,
            "meets_accuracy_target": bool(error.mean() <= 0.5)}  # fmt: skip


def warp_field(shape, affine, amplitude_mm: float, seed: int):
    """A smooth random displacement (RAS mm) on a grid, as a callable on RAS points."""
    rng = np.random.default_rng(seed)
    coarse = [ndimage.zoom(ndimage.gaussian_filter(rng.normal(size=(12, 14, 12)), 1.5), np.array(shape) / (12, 14, 12), order=3)
              for _ in range(3)]  # fmt: skip
    field = np.stack([c[: shape[0], : shape[1], : shape[2]] for c in coarse], -1)
    field *= amplitude_mm / np.abs(field).max()
    g = Grid(affine, shape)

    def displace(points):
        vox = g.to_voxels(points).T
        return points + np.stack([ndimage.map_coordinates(field[..., c], vox, order=1) for c in range(3)], 1)

    return displace


def make_syn(folder: Path, template, affine) -> dict:
    """The subject: the template under a known affine and smooth warp, with bias and noise."""
    src = Grid(affine, template.shape)
    lin = rigid(4, -3, 5, (3.0, -2.0, 2.0)) @ np.diag([1.04, 0.97, 1.02, 1.0])
    warp = warp_field(template.shape, affine, 5.0, 7)

    def subject_to_mni(points):  # phi: a subject point -> the MNI point of the same anatomy
        return warp(points @ lin[:3, :3].T + lin[:3, 3])

    subject = resample(template, src, src, subject_to_mni, "linear")
    nib.save(nib.Nifti1Image(bias_and_noise(subject, 2), affine), folder / "subject_t1.nii.gz")
    brain = subject > 0.1 * subject.max()
    pts = grid_points(src)[brain.ravel()][::7]
    truth_labels = {}
    for name in ("harvard-oxford-cortical", "harvard-oxford-subcortical"):
        labels, atlas_affine, _ = load_atlas(name)
        truth_labels[name] = resample(labels, Grid(atlas_affine, labels.shape), src, subject_to_mni, "nearest")
    return {"grid": src, "points": pts, "truth_points": subject_to_mni(pts), "truth_labels": truth_labels}


def syn_case(case: dict, folder: Path, tag: str) -> dict:
    src = case["grid"]
    out = folder / f"reg_syn_{tag}"
    command = ["register", str(folder / "subject_t1.nii.gz"), "mni", "-o", str(out), "--type", "syn", "--metric", "cc",
               "--quiet", "--json", *EXTRA]  # fmt: skip
    seconds, _ = run(command)
    reg = load_registration(out)
    pts = case["points"]
    error = np.linalg.norm(reg.moving_to_fixed(pts) - case["truth_points"], axis=1)
    round_trip = np.linalg.norm(reg.fixed_to_moving(reg.moving_to_fixed(pts)) - pts, axis=1)
    dice = []
    for name, true_labels in case["truth_labels"].items():
        labels, atlas_affine, table = load_atlas(name)
        ours = reg.template_to_subject(labels, Grid(atlas_affine, labels.shape), src, "nearest")
        for value, structure in table:
            t, o = true_labels == value, ours == value
            if t.sum() * np.prod(src.voxel_sizes) < 1000:  # regions larger than 1 cm³
                continue
            dice.append((structure, float(2 * (t & o).sum() / (t.sum() + o.sum()))))
    record = json.loads((out / "registration.json").read_text())
    values = [d for _, d in dice]
    row = {
        "case": "subject T1 1 mm (template under a known affine + smooth warp of up to 5 mm, bias, noise) -> mni, syn",
        "command": shown(command), "seconds": round(seconds, 2), "target_seconds": TARGETS["syn"],
        "meets_speed_target": seconds <= TARGETS["syn"], "stage_seconds": record["seconds"],
        "mean_error_mm": round(float(error.mean()), 3), "forward_inverse_mm": round(float(round_trip.mean()), 3),
        "regions": len(values), "mean_dice": round(float(np.mean(values)), 4), "min_dice": round(float(np.min(values)), 4),
        "worst_regions": sorted(dice, key=lambda d: d[1])[:5], "target_mean_dice": 0.85, "target_forward_inverse_mm": 0.5,
        "meets_accuracy_target": bool(np.mean(values) >= 0.85 and round_trip.mean() <= 0.5),
    }  # fmt: skip
    return row, out


def atlas_rows(folder: Path, registration: Path, tag: str, devices: list[str]) -> list[dict]:
    """``tractlens atlas`` onto the 1 mm subject on each device: the first use, then the next."""
    rows = []
    for device in devices:
        command = ["atlas", "harvard-oxford-cortical", "--registration", str(registration), "--reference",
                   str(folder / "subject_t1.nii.gz"), "-o", str(folder / f"ho_{tag}_{device}.nii.gz"), "--device", device,
                   "--quiet"]  # fmt: skip
        first, _ = run(command)  # fills the label-map cache (first use of the atlas)
        seconds, _ = run(command)
        rows.append({"case": f"harvard-oxford-cortical onto the 1 mm subject through the SyN registration, --device {device}",
                     "command": shown(command), "seconds": round(seconds, 2), "first_use_seconds": round(first, 2),
                     "target_seconds": TARGETS["atlas"], "meets_speed_target": seconds <= TARGETS["atlas"]})  # fmt: skip
        if device == "cpu":  # the resampler's choice against numba's loop forced (gpu.resample._compiled_pays)
            force = "import tractlens.gpu.resample as r; r.COMPILED_START_SAMPLES = {0: 0, 1: 0}; "
            forced = min(run(command, force)[0] for _ in range(2))
            rows.append({"case": "the same, numba's compiled loop forced (comparison: not a target row)",
                         "command": shown(command) + "  [COMPILED_START_SAMPLES = 0]",
                         "seconds": round(forced, 2)})  # fmt: skip
    return rows


def startup_row() -> dict:
    """A command that does nothing but start: the imports every anatomy command pays."""
    command = ["atlas", "list", "--quiet"]
    run(command)
    seconds = min(run(command)[0] for _ in range(3))
    return {"case": "start-up (imports): tractlens atlas list", "command": shown(command), "seconds": round(seconds, 2)}


def device_slug() -> str:
    """'h100', 'h200', ... from the GPU's name, else 'cpu'."""
    from tractlens.gpu.backend import gpu_status

    ok, name = gpu_status()
    if not ok:
        return "cpu"
    for word in name.replace("-", " ").split():
        if word[:1] in "HABLV" and word[1:].isdigit():
            return word.lower()
    return "gpu"


def main() -> None:
    global CORES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the JSON file (default results/registration_<device>.json)")
    parser.add_argument(
        "--cases", default="rigid,affine,syn", help="of rigid, affine, syn (syn includes the atlas; atlas: the same)"
    )
    parser.add_argument("--cores", default="all,2", help="passes: 'all' and/or a number of cores, e.g. all,2")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (cases, registrations, outputs)")
    parser.add_argument("--register-args", default="", help="more tractlens register options, e.g. '--sampling 0.1'")
    args = parser.parse_args()
    EXTRA.extend(args.register_args.split())
    from tractlens.gpu.backend import gpu_status

    devices = ["cpu", "gpu"] if gpu_status()[0] else ["cpu"]
    slug = device_slug()
    # whether the commands import our modules from bytecode (as after a pip install) or compile them
    bytecode = Path(importlib.util.cache_from_source(str(ROOT / "app" / "anatomy.py"))).is_file()
    name = f"registration_{slug}{'' if bytecode else '_from_source'}.json"
    out_path = args.out or ROOT / "tests" / "benchmarks" / "results" / name
    template, affine = load_template("mni")
    template = np.array(template)
    available = sorted(os.sched_getaffinity(0))
    results = {"machine": platform.node(), "device": gpu_status()[1], "cpus": len(available),
               "python": platform.python_version(), "bytecode": bytecode, "targets_seconds": TARGETS,
               "passes": []}  # fmt: skip
    cases = list(dict.fromkeys("syn" if case == "atlas" else case for case in args.cases.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) if args.keep is None else args.keep
        folder.mkdir(parents=True, exist_ok=True)
        made = {kind: make_linear(kind, folder, template, affine) for kind in cases if kind in ("rigid", "affine")}
        if "syn" in cases:
            made["syn"] = make_syn(folder, template, affine)
        for cores in args.cores.split(","):
            CORES = None if cores == "all" else available[: int(cores)]
            tag = f"{len(CORES or available)}cores"
            rows = [startup_row()]
            for kind in cases:
                if kind == "syn":
                    row, registration = syn_case(made[kind], folder, tag)
                    rows.append(row)
                    rows.extend(atlas_rows(folder, registration, tag, devices if CORES is None else ["cpu"]))
                else:
                    rows.append(linear_case(made[kind], folder, tag))
            for row in rows:
                row["command"] += (
                    (" " + args.register_args) if args.register_args and "register" in row["command"] else ""
                )
                verdict = {True: "meets", False: "MISSES"}.get(row.get("meets_speed_target"), "")
                print(f"[{tag}] {row['seconds']:6.2f} s {verdict:6s} {row['case'][:70]}", flush=True)
            results["passes"].append({"cores": len(CORES or available), "rows": rows})
            print(json.dumps(rows), flush=True)
    results["command"] = "python tests/benchmarks/bench_registration.py " + " ".join(sys.argv[1:])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2))
    print(f"written {out_path}")


if __name__ == "__main__":
    main()
