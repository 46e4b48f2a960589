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
- ``atlas``: ``tractlens atlas harvard-oxford-cortical`` onto the subject (whole command).

Every time is a whole ``tractlens`` command in a fresh process (``python -m tractlens.app.cli ...``, what the ``tractlens`` script runs for a subcommand), the way a
user runs it. Usage::

    python tests/benchmarks/bench_registration.py --out tests/benchmarks/results/registration_<machine>.json
"""

from __future__ import annotations

import argparse
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


def run(command: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tractlens.app.cli", *command], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"tractlens {' '.join(command)} failed:\n{done.stderr}")
    return seconds, done.stdout


EXTRA: list[str] = []  # more `tractlens register` options (--register-args)


def linear_case(kind: str, folder: Path, template, affine) -> dict:
    """T1 (template, moving) onto a b=0-like 2 mm image (fixed) moved by a known transform."""
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
    nib.save(nib.Nifti1Image(bias_and_noise(b0, 1), g.affine), folder / "b0.nii.gz")
    nib.save(nib.Nifti1Image(np.asarray(template), affine), folder / "t1.nii.gz")
    out = folder / f"reg_{kind}"
    seconds, _ = run(["register", str(folder / "t1.nii.gz"), str(folder / "b0.nii.gz"), "-o", str(out), "--type", kind,
                      "--quiet", "--json", *EXTRA])  # fmt: skip
    reg = load_registration(out)
    pts = grid_points(g)[brain.ravel()]
    error = np.linalg.norm(reg.fixed_to_moving(pts) - (pts @ truth[:3, :3].T + truth[:3, 3]), axis=1)
    record = json.loads((out / "registration.json").read_text())
    return {"case": f"T1 1 mm -> b=0-like 2 mm, {kind}", "command": f"tractlens register t1.nii.gz b0.nii.gz -o DIR --type {kind}",
            "seconds": round(seconds, 2), "stage_seconds": record["seconds"], "mean_error_mm": round(float(error.mean()), 3),
            "max_error_mm": round(float(error.max()), 3), "target_mean_error_mm": 0.5}  # fmt: skip


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


def syn_case(folder: Path, template, affine) -> dict:
    src = Grid(affine, template.shape)
    lin = rigid(4, -3, 5, (3.0, -2.0, 2.0)) @ np.diag([1.04, 0.97, 1.02, 1.0])
    warp = warp_field(template.shape, affine, 5.0, 7)

    def subject_to_mni(points):  # phi: a subject point -> the MNI point of the same anatomy
        return warp(points @ lin[:3, :3].T + lin[:3, 3])

    subject = resample(template, src, src, subject_to_mni, "linear")
    nib.save(nib.Nifti1Image(bias_and_noise(subject, 2), affine), folder / "subject_t1.nii.gz")
    out = folder / "reg_syn"
    seconds, _ = run(["register", str(folder / "subject_t1.nii.gz"), "mni", "-o", str(out), "--type", "syn", "--metric", "cc",
                      "--quiet", "--json", *EXTRA])  # fmt: skip
    reg = load_registration(out)
    brain = subject > 0.1 * subject.max()
    pts = grid_points(src)[brain.ravel()][::7]
    error = np.linalg.norm(reg.moving_to_fixed(pts) - subject_to_mni(pts), axis=1)
    round_trip = np.linalg.norm(reg.fixed_to_moving(reg.moving_to_fixed(pts)) - pts, axis=1)
    dice = []
    for name in ("harvard-oxford-cortical", "harvard-oxford-subcortical"):
        labels, atlas_affine, table = load_atlas(name)
        ours = reg.template_to_subject(labels, Grid(atlas_affine, labels.shape), src, "nearest")
        true = resample(labels, Grid(atlas_affine, labels.shape), src, subject_to_mni, "nearest")
        for value, structure in table:
            t, o = true == value, ours == value
            if t.sum() * np.prod(src.voxel_sizes) < 1000:  # regions larger than 1 cm³
                continue
            dice.append((structure, float(2 * (t & o).sum() / (t.sum() + o.sum()))))
    record = json.loads((out / "registration.json").read_text())
    atlas = ["atlas", "harvard-oxford-cortical", "--registration", str(out), "--reference",
             str(folder / "subject_t1.nii.gz"), "-o", str(folder / "ho.nii.gz"), "--quiet"]  # fmt: skip
    first_atlas_seconds, _ = run(atlas)  # fills the cache of the probabilistic atlas's label map
    atlas_seconds, _ = run(atlas)
    values = [d for _, d in dice]
    return {
        "case": "subject T1 1 mm (template under a known affine + smooth warp of up to 5 mm, bias, noise) -> mni, syn",
        "command": "tractlens register subject_t1.nii.gz mni -o DIR --type syn --metric cc",
        "seconds": round(seconds, 2), "stage_seconds": record["seconds"],
        "mean_error_mm": round(float(error.mean()), 3), "forward_inverse_mm": round(float(round_trip.mean()), 3),
        "regions": len(values), "mean_dice": round(float(np.mean(values)), 4), "min_dice": round(float(np.min(values)), 4),
        "worst_regions": sorted(dice, key=lambda d: d[1])[:5], "target_mean_dice": 0.85, "target_forward_inverse_mm": 0.5,
        "atlas_command": "tractlens atlas harvard-oxford-cortical --registration DIR --reference subject_t1.nii.gz -o ho.nii.gz",
        "atlas_seconds": round(atlas_seconds, 2), "atlas_first_use_seconds": round(first_atlas_seconds, 2),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--cases", default="rigid,affine,syn")
    parser.add_argument("--register-args", default="", help="more tractlens register options, e.g. '--sampling 0.1'")
    args = parser.parse_args()
    EXTRA.extend(args.register_args.split())
    template, affine = load_template("mni")
    template = np.array(template)
    results = {"machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(), "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for case in args.cases.split(","):
            row = syn_case(folder, template, affine) if case == "syn" else linear_case(case, folder, template, affine)
            row["command"] += (" " + args.register_args) if args.register_args else ""
            print(json.dumps(row), flush=True)
            results["cases"].append(row)
    results["command"] = "python tests/benchmarks/bench_registration.py " + " ".join(sys.argv[1:])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
