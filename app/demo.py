"""The built-in demo dataset: a synthetic diffusion phantom made by our own code.

A 56 x 56 x 24 grid of 2 mm voxels holds an ellipsoidal "brain" of grey-matter-like
isotropic tissue with five white-matter bundles of known course:

* ``crossing_lr`` and ``crossing_ap``: straight bundles crossing at 90° (upper plane);
* ``arc``: a half-circle, a curving bundle (lower plane, left);
* ``kissing_lower`` and ``kissing_upper``: two arcs that touch tangentially and part
  again (lower plane, right).

Signal per voxel (stick-zeppelin-ball): S = S0 [Σ_b v_b (f_ic·stick + (1-f_ic)·zeppelin)
+ v_gm·ball], with d_par 1.7e-3, d_perp 0.5e-3, grey matter 0.9e-3 mm²/s, f_ic 0.6,
partial volume from the distance to each bundle's centre line, then Rician noise
with SNR 25 at b=0. 4 b=0 + 32 directions at b=1000 + 32 at b=2000 s/mm².
Everything comes from a fixed random seed, so every machine makes the same data.

The dataset is generated on first use and cached (``$TRACTLENS_CACHE`` or
``$XDG_CACHE_HOME/tractlens``, default ``~/.cache/tractlens``); ``tractlens
demo-data OUTDIR`` writes a copy. Files: ``dwi.nii.gz`` + ``dwi.bval`` +
``dwi.bvec`` (FSL convention), ``mask.nii.gz`` (true brain), ``labels.nii.gz``
(dominant bundle id), ``roi_<bundle>_seed/target.nii.gz``, ``bundles.trk``
(ground-truth streamlines, per-streamline ``bundle`` id), ``parcellation.nii.gz`` with
``parcellation.txt`` (FreeSurfer-style LUT: the start and end region of every bundle, so
bundle k joins regions 2k-1 and 2k), ``lesion.nii.gz`` (a sphere of radius 2.5 voxels
beside ``crossing_lr``), ``demo.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .io import save_gradients, save_tractogram, save_volume
from .io._atomic import atomic_path
from .io.outputs import check_output_folder
from .model import Tractogram

DEMO_VERSION = 2
SHAPE = (56, 56, 24)
VOXEL_MM = 2.0
SEED = 20261121
SNR = 25.0
S0 = 1000.0  # scanner-like integer range; written as int16
D_PAR, D_PERP, D_GM = 1.7e-3, 0.5e-3, 0.9e-3
F_INTRA = 0.6
ROI_FRACTIONS = {"seed": (0.06, 0.14), "target": (0.86, 0.94)}
END_FRACTION = 0.12  # a bundle's first and last 12 % (of its length) are its two parcellation regions
LESION_CENTRE, LESION_RADIUS = (18.0, 34.0, 15.0), 2.5  # voxels: beside crossing_lr, 6 voxels off its axis


@dataclass(frozen=True)
class Bundle:
    """A tube of radius ``radius`` (voxels) around a planar centre line in a z-plane."""

    name: str
    label: int
    centre_line: np.ndarray  # (M, 3) voxel coordinates, densely sampled
    radius: float


def _line(start, stop, samples=200):
    t = np.linspace(0.0, 1.0, samples)[:, None]
    return np.asarray(start, float) * (1 - t) + np.asarray(stop, float) * t


def _arc(centre, radius, t0, t1, z, samples=200):
    t = np.linspace(t0, t1, samples)
    return np.stack([centre[0] + radius * np.cos(t), centre[1] + radius * np.sin(t), np.full_like(t, z)], axis=1)


_LUT_COLOURS = ((230, 60, 60), (60, 200, 60), (70, 110, 240), (230, 180, 40), (190, 70, 220))


def bundles() -> list[Bundle]:
    upper, lower = 15.0, 7.0
    return [
        Bundle("crossing_lr", 1, _line((8, 28, upper), (48, 28, upper)), 3.0),
        Bundle("crossing_ap", 2, _line((28, 8, upper), (28, 48, upper)), 3.0),
        Bundle("arc", 3, _arc((22, 28), 8.0, 0.5 * np.pi, 1.5 * np.pi, lower), 2.5),
        Bundle("kissing_lower", 4, _arc((36, 19), 7.0, 0.0, np.pi, lower), 2.0),
        Bundle("kissing_upper", 5, _arc((36, 37), 7.0, np.pi, 2.0 * np.pi, lower), 2.0),
    ]


def gradient_table(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """4 b=0, then 32 directions at b=1000 and 32 (a different set) at b=2000."""

    def hemisphere(n, offset):
        i = np.arange(n) + 0.5
        z = 1.0 - i / n  # upper hemisphere, Fibonacci spiral
        phi = np.pi * (1 + 5**0.5) * i + offset
        r = np.sqrt(1 - z * z)
        return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)

    dirs1 = hemisphere(32, 0.0)
    dirs2 = hemisphere(32, rng.uniform(0, 2 * np.pi))
    bvals = np.concatenate([np.zeros(4), np.full(32, 1000.0), np.full(32, 2000.0)])
    bvecs = np.concatenate([np.zeros((4, 3)), dirs1, dirs2])
    return bvals, bvecs


def _nearest_on_line(points: np.ndarray, line: np.ndarray, chunk: int = 4096):
    """Distance to a polyline's samples, the index of the nearest sample, per point."""
    dist = np.empty(len(points))
    index = np.empty(len(points), dtype=np.int64)
    for start in range(0, len(points), chunk):
        block = points[start : start + chunk]
        d2 = ((block[:, None, :] - line[None, :, :]) ** 2).sum(-1)
        index[start : start + chunk] = d2.argmin(axis=1)
        dist[start : start + chunk] = np.sqrt(d2.min(axis=1))
    return dist, index


def _tangents(line: np.ndarray) -> np.ndarray:
    t = np.gradient(line, axis=0)
    return t / np.linalg.norm(t, axis=1, keepdims=True)


@dataclass
class Phantom:
    dwi: np.ndarray
    bvals: np.ndarray
    bvecs: np.ndarray  # voxel axes
    affine: np.ndarray
    brain: np.ndarray
    occupancy: np.ndarray  # (X, Y, Z, n_bundles)
    arclength: np.ndarray  # (X, Y, Z, n_bundles) position 0..1 along each bundle
    directions: np.ndarray  # (X, Y, Z, n_bundles, 3)
    bundles: list[Bundle]


def affine() -> np.ndarray:
    aff = np.diag([VOXEL_MM, VOXEL_MM, VOXEL_MM, 1.0])
    aff[:3, 3] = -VOXEL_MM * (np.array(SHAPE) - 1) / 2.0
    return aff


def make_phantom(seed: int = SEED) -> Phantom:
    """Generate the phantom in memory (deterministic for a given seed)."""
    rng = np.random.default_rng(seed)
    bvals, bvecs = gradient_table(rng)
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in SHAPE], indexing="ij"), axis=-1)
    centre = (np.array(SHAPE) - 1) / 2.0
    radii = np.array([26.0, 26.0, 11.0])
    brain = (((grid - centre) / radii) ** 2).sum(-1) <= 1.0
    bundle_list = bundles()
    nb = len(bundle_list)
    occupancy = np.zeros((*SHAPE, nb))
    arclength = np.zeros((*SHAPE, nb))
    directions = np.zeros((*SHAPE, nb, 3))
    flat = grid.reshape(-1, 3)
    for k, bundle in enumerate(bundle_list):
        lo = bundle.centre_line.min(0) - bundle.radius - 2
        hi = bundle.centre_line.max(0) + bundle.radius + 2
        near = np.all((flat >= lo) & (flat <= hi), axis=1)
        dist, index = _nearest_on_line(flat[near], bundle.centre_line)
        vol = np.clip(bundle.radius + 0.5 - dist, 0.0, 1.0)
        occupancy.reshape(-1, nb)[near, k] = vol
        arclength.reshape(-1, nb)[near, k] = index / (len(bundle.centre_line) - 1)
        directions.reshape(-1, nb, 3)[near, k] = _tangents(bundle.centre_line)[index]
    occupancy *= brain[..., None]
    total = occupancy.sum(-1, keepdims=True)
    occupancy = np.where(total > 1.0, occupancy / np.maximum(total, 1e-12), occupancy)

    # Noise-free signal, one b-value/direction at a time to bound memory.
    signal = np.zeros((*SHAPE, len(bvals)), dtype=np.float32)
    v_gm = np.clip(1.0 - occupancy.sum(-1), 0.0, 1.0) * brain
    for m, (b, g) in enumerate(zip(bvals, bvecs, strict=True)):
        cos2 = (directions @ g) ** 2  # (X, Y, Z, nb)
        stick = np.exp(-b * D_PAR * cos2)
        zeppelin = np.exp(-b * ((D_PAR - D_PERP) * cos2 + D_PERP))
        wm = (occupancy * (F_INTRA * stick + (1 - F_INTRA) * zeppelin)).sum(-1)
        signal[..., m] = S0 * (wm + v_gm * np.exp(-b * D_GM))
    sigma = S0 / SNR
    noisy = np.sqrt((signal + rng.normal(0, sigma, signal.shape)) ** 2 + rng.normal(0, sigma, signal.shape) ** 2)
    return Phantom(
        noisy.astype(np.float32), bvals, bvecs, affine(), brain, occupancy, arclength, directions, bundle_list
    )


def ground_truth_streamlines(bundle: Bundle, per_axis: int = 5) -> list[np.ndarray]:
    """Streamlines parallel to the centre line filling the tube's core (80 % radius)."""
    line = bundle.centre_line[::4]
    tang = _tangents(line)
    normal = np.stack([-tang[:, 1], tang[:, 0], np.zeros(len(tang))], axis=1)
    normal /= np.linalg.norm(normal, axis=1, keepdims=True)
    up = np.array([0.0, 0.0, 1.0])
    offsets = np.linspace(-0.8, 0.8, per_axis) * bundle.radius
    out = []
    for u in offsets:
        for w in offsets:
            if u * u + w * w <= (0.8 * bundle.radius) ** 2:
                out.append(line + u * normal + w * up)
    return out


def write_phantom(phantom: Phantom, outdir: str | os.PathLike) -> Path:
    """Write the phantom's files (see module docstring) into ``outdir``."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    aff = phantom.affine
    save_volume(np.round(phantom.dwi), aff, out / "dwi.nii.gz", dtype=np.int16)
    save_gradients(phantom.bvals, phantom.bvecs, aff, out / "dwi.bval", out / "dwi.bvec")
    save_volume(phantom.brain.astype(np.uint8), aff, out / "mask.nii.gz")
    labels = np.where(phantom.occupancy.max(-1) >= 0.5, phantom.occupancy.argmax(-1) + 1, 0)
    save_volume(labels.astype(np.uint8), aff, out / "labels.nii.gz")
    parcellation = np.zeros(SHAPE, dtype=np.uint8)
    lut_lines = ["# TractLens demo parcellation: index name R G B A"]
    for k, bundle in enumerate(phantom.bundles):
        tube = phantom.occupancy[..., k] >= 0.2
        arc = phantom.arclength[..., k]
        for region, (part, inside) in enumerate((("start", arc <= END_FRACTION), ("end", arc >= 1 - END_FRACTION))):
            label = 2 * k + 1 + region
            parcellation[tube & inside & (parcellation == 0)] = label
            rgb = (np.array(_LUT_COLOURS[k]) * (1.0 if region == 0 else 0.6)).astype(int)
            lut_lines.append(f"{label:<4d} {bundle.name}_{part:<8s} {rgb[0]:3d} {rgb[1]:3d} {rgb[2]:3d} 0")
    save_volume(parcellation, aff, out / "parcellation.nii.gz")
    (out / "parcellation.txt").write_text("\n".join(lut_lines) + "\n")
    grid = np.indices(SHAPE, dtype=np.float64)
    centre = np.asarray(LESION_CENTRE)[:, None, None, None]
    lesion = ((grid - centre) ** 2).sum(axis=0) <= LESION_RADIUS**2
    save_volume(lesion.astype(np.uint8), aff, out / "lesion.nii.gz")
    rois = {}
    streamlines, bundle_ids = [], []
    for k, bundle in enumerate(phantom.bundles):
        core = phantom.occupancy[..., k] >= 0.5
        for role, (lo, hi) in ROI_FRACTIONS.items():
            roi = core & (phantom.arclength[..., k] >= lo) & (phantom.arclength[..., k] <= hi)
            name = f"roi_{bundle.name}_{role}.nii.gz"
            save_volume(roi.astype(np.uint8), aff, out / name)
            rois[name] = {"bundle": bundle.name, "role": role, "voxels": int(roi.sum())}
        lines = ground_truth_streamlines(bundle)
        streamlines += lines
        bundle_ids += [bundle.label] * len(lines)
    tract = Tractogram.from_list(
        streamlines,
        affine=aff,
        dimensions=SHAPE,
        streamline_scalars={"bundle": np.array(bundle_ids, np.float32)},
        name="bundles",
    )
    save_tractogram(tract, out / "bundles.trk")
    manifest = {
        "name": "TractLens demo phantom",
        "version": DEMO_VERSION,
        "seed": SEED,
        "shape": list(SHAPE),
        "voxel_mm": VOXEL_MM,
        "snr_b0": SNR,
        "bvals": sorted({float(b) for b in phantom.bvals}),
        "model": {"d_par": D_PAR, "d_perp": D_PERP, "d_gm": D_GM, "f_intra": F_INTRA, "s0": S0},
        "bundles": [{"name": b.name, "label": b.label, "radius_voxels": b.radius} for b in phantom.bundles],
        "rois": rois,
        "files": {
            "dwi": "dwi.nii.gz",
            "bval": "dwi.bval",
            "bvec": "dwi.bvec",
            "mask": "mask.nii.gz",
            "labels": "labels.nii.gz",
            "bundles": "bundles.trk",
            "parcellation": "parcellation.nii.gz",
            "parcellation_lut": "parcellation.txt",
            "lesion": "lesion.nii.gz",
        },
        "lesion": {"centre_voxels": list(LESION_CENTRE), "radius_voxels": LESION_RADIUS},
    }
    (out / "demo.json").write_text(json.dumps(manifest, indent=2))
    return out


def cache_dir() -> Path:
    root = os.environ.get("TRACTLENS_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tractlens"


def demo_path() -> Path:
    """Folder of the cached demo dataset, generating it on first use (atomically)."""
    target = cache_dir() / f"demo-v{DEMO_VERSION}"
    if (target / "demo.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-", dir=target.parent))
    try:
        write_phantom(make_phantom(), tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race, or a stale partial folder
            if not (target / "demo.json").exists():
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_demo(outdir: str | os.PathLike) -> Path:
    """Copy the (cached) demo dataset into ``outdir``."""
    out = check_output_folder(outdir, "demo folder")
    source = demo_path()
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        with atomic_path(out / item.name) as tmp:  # an interrupted copy leaves no half file
            shutil.copy2(item, tmp)
    return out
