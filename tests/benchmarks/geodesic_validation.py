"""Validation of geodesic tracking on phantoms with curved, crossing and kissing bundles.

    python tests/benchmarks/geodesic_validation.py [--full] [--metrics adjugate inverse ...]
        [--device cpu] [--two-point] [--out tests/benchmarks/results/geodesic_validation]
        [--option name=value ...]

Phantoms (made here, independent of the demo): tubes around arcs of radius 10–50 voxels,
2–6 voxels wide, an arc crossed at right angles by a straight bundle, and two arcs kissing
(tangent to each other at one point); 2 mm or 1.25 mm voxels. Signal: ball & stick per bundle
(stick 1.7e-3 mm²/s, intra-axonal fraction 0.7, ball 1.0e-3) plus a grey-matter ball
(0.9e-3) for the rest of each voxel, the volume fractions taken from 3×3×3 sub-samples of
every voxel (so partial voluming at the edges and two sticks in a crossing); one shell
b = 1000 s/mm², 32 directions and 3 b = 0; Rician noise at SNR 10–30 (of S0). The tensor fit
is the product's (WLS, :func:`gpu.dti.fit_dti`). Tracking mask: voxels at least half inside a
bundle with FA ≥ 0.2 (tight). Seed ROI: the mask voxels of the first 2.5 voxels of a bundle;
target: its last 2.5 voxels.

Per bundle: ``connected`` — the share of seed points from which at least one fibre reaches
the target; ``top20_inside`` — the share of the top 20 % of reaching fibres by CM that lie in
the true bundle (every point within the tube radius + 1 voxel and within its ends ± 1 voxel);
``auc`` — how well CM ranks reaching fibres in the true bundle over those outside it
(Mann–Whitney; ``null`` when one class is empty, with both counts given). The quick set (the
default, a few minutes on the CPU) covers every configuration once; ``--full`` crosses radii,
widths, voxel sizes and SNRs. Results: ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

B_VALUE, N_DIRECTIONS, N_B0 = 1000.0, 32, 3
D_STICK, F_STICK, D_BALL, D_GREY = 1.7e-3, 0.7, 1.0e-3, 0.9e-3
MARGIN = 4  # voxels around the bundles
END_VOXELS = 2.5  # length of the seed and target ROIs along the bundle
INSIDE_SLACK = 1.0  # voxels beyond the tube radius still counted as inside


# ------------------------------------------------------------------------------- geometry
@dataclass(frozen=True)
class Arc:
    """A tube of ``radius`` around an arc in the plane z = ``z``: centre, arc radius, angles."""

    centre: tuple[float, float]
    arc_radius: float
    start: float
    sweep: float
    z: float
    radius: float

    @property
    def length(self) -> float:
        return self.arc_radius * abs(self.sweep)

    def locate(self, p: np.ndarray):
        """Distance to the centre line, arc length of the nearest centre point, tangent there."""
        dx, dy = p[..., 0] - self.centre[0], p[..., 1] - self.centre[1]
        angle = np.arctan2(dy, dx)
        rel = np.mod(angle - self.start + np.pi, 2 * np.pi) - np.pi  # (-π, π] from the start
        if self.sweep < 0:
            rel = -rel
        t = np.clip(rel, 0.0, abs(self.sweep))
        theta = self.start + np.sign(self.sweep) * t
        cx = self.centre[0] + self.arc_radius * np.cos(theta)
        cy = self.centre[1] + self.arc_radius * np.sin(theta)
        dist = np.sqrt((p[..., 0] - cx) ** 2 + (p[..., 1] - cy) ** 2 + (p[..., 2] - self.z) ** 2)
        s = self.arc_radius * rel  # may run beyond [0, length]: the ends
        tangent = np.stack([-np.sin(theta), np.cos(theta), np.zeros_like(theta)], -1) * np.sign(self.sweep)
        return dist, s, tangent

    def point(self, s: float) -> np.ndarray:
        theta = self.start + np.sign(self.sweep) * s / self.arc_radius
        return np.array([self.centre[0] + self.arc_radius * np.cos(theta),
                         self.centre[1] + self.arc_radius * np.sin(theta), self.z])  # fmt: skip


@dataclass(frozen=True)
class Line:
    a: tuple[float, float, float]
    b: tuple[float, float, float]
    radius: float

    @property
    def length(self) -> float:
        return float(np.linalg.norm(np.subtract(self.b, self.a)))

    def locate(self, p: np.ndarray):
        a, b = np.asarray(self.a, float), np.asarray(self.b, float)
        u = (b - a) / np.linalg.norm(b - a)
        s = (p - a) @ u
        nearest = a + np.clip(s, 0, self.length)[..., None] * u
        dist = np.linalg.norm(p - nearest, axis=-1)
        return dist, s, np.broadcast_to(u, p.shape)

    def point(self, s: float) -> np.ndarray:
        a, b = np.asarray(self.a, float), np.asarray(self.b, float)
        return a + s * (b - a) / np.linalg.norm(b - a)


@dataclass(frozen=True)
class Setting:
    kind: str  # arc, crossing, kissing
    arc_radius: float  # voxels
    width: float  # bundle diameter, voxels
    voxel_mm: float
    snr: float
    seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.kind} R{self.arc_radius:g} w{self.width:g} {self.voxel_mm:g}mm SNR{self.snr:g}"


def bundles_of(setting: Setting) -> tuple[list, tuple[int, int, int]]:
    """The bundles (in voxel coordinates, placed with a margin) and the grid shape."""
    r, tube = setting.arc_radius, setting.width / 2.0
    sweep = min(2.0 * np.pi / 3.0, 60.0 / r)  # 120°, at most 60 voxels along the arc
    z = MARGIN + tube
    if setting.kind == "arc":
        shapes = [Arc((0.0, 0.0), r, 0.0, sweep, z, tube)]
    elif setting.kind == "crossing":
        arc = Arc((0.0, 0.0), r, 0.0, sweep, z, tube)
        mid = arc.point(arc.length / 2)
        normal = mid[:2] / np.linalg.norm(mid[:2])  # across the arc, in its plane
        half = min(12.0, 0.8 * r)
        a = (mid[0] - half * normal[0], mid[1] - half * normal[1], z)
        b = (mid[0] + half * normal[0], mid[1] + half * normal[1], z)
        shapes = [arc, Line(a, b, tube)]
    elif setting.kind == "kissing":
        # Two arcs of the same radius bending away from each other, tangent at the middle.
        half_sweep = sweep / 2
        first = Arc((0.0, 0.0), r, -half_sweep, sweep, z, tube)
        second = Arc((2 * r + 2 * tube, 0.0), r, np.pi + half_sweep, -sweep, z, tube)
        shapes = [first, second]
    else:
        raise ValueError(setting.kind)
    lo = np.full(3, np.inf)
    hi = np.full(3, -np.inf)
    for shape in shapes:
        for s in np.linspace(0, shape.length, 64):
            p = shape.point(s)
            lo, hi = np.minimum(lo, p - tube), np.maximum(hi, p + tube)
    shift = MARGIN - lo
    shifted = []
    for shape in shapes:
        if isinstance(shape, Arc):
            shifted.append(replace(shape, centre=(shape.centre[0] + shift[0], shape.centre[1] + shift[1]),
                                   z=shape.z + shift[2]))  # fmt: skip
        else:
            shifted.append(replace(shape, a=tuple(np.add(shape.a, shift)), b=tuple(np.add(shape.b, shift))))
    grid = tuple(math.ceil(float(v)) for v in (hi - lo + 2 * MARGIN + 1))
    return shifted, grid


# ------------------------------------------------------------------------------- phantom
def gradient_table():
    i = np.arange(N_DIRECTIONS) + 0.5
    z = 1.0 - i / N_DIRECTIONS
    phi = np.pi * (1 + 5**0.5) * i
    dirs = np.stack([np.sqrt(1 - z * z) * np.cos(phi), np.sqrt(1 - z * z) * np.sin(phi), z], 1)
    bvals = np.concatenate([np.zeros(N_B0), np.full(N_DIRECTIONS, B_VALUE)])
    return bvals, np.concatenate([np.zeros((N_B0, 3)), dirs])


def phantom(setting: Setting):
    """Signal, fractions and directions per bundle, and the fitted tensor field."""
    from tractlens.gpu.dti import fit_dti

    shapes, grid = bundles_of(setting)
    rng = np.random.default_rng(setting.seed)
    centres = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in grid], indexing="ij"), -1)
    offsets = np.stack(np.meshgrid(*[np.array([-1, 0, 1]) / 3.0] * 3, indexing="ij"), -1).reshape(-1, 3)
    fractions = np.zeros((*grid, len(shapes)))
    tangents = np.zeros((*grid, len(shapes), 3))
    for k, shape in enumerate(shapes):
        inside = np.zeros(grid)
        for off in offsets:
            dist, s, _ = shape.locate(centres + off)
            inside += (dist <= shape.radius) & (s >= 0) & (s <= shape.length)
        fractions[..., k] = inside / len(offsets)
        tangents[..., k, :] = shape.locate(centres)[2]
    total = fractions.sum(-1, keepdims=True)
    fractions = np.where(total > 1, fractions / np.maximum(total, 1e-9), fractions)
    bvals, bvecs = gradient_table()
    grey = 1.0 - fractions.sum(-1)
    signal = np.empty((*grid, len(bvals)))
    for m, (b, g) in enumerate(zip(bvals, bvecs, strict=True)):
        stick = np.exp(-b * D_STICK * (tangents @ g) ** 2)
        bundle = F_STICK * stick + (1 - F_STICK) * np.exp(-b * D_BALL)
        signal[..., m] = (fractions * bundle).sum(-1) + grey * np.exp(-b * D_GREY)
    sigma = 1.0 / setting.snr
    noisy = np.sqrt((signal + rng.normal(0, sigma, signal.shape)) ** 2 + rng.normal(0, sigma, signal.shape) ** 2)
    fit = fit_dti(noisy.reshape(-1, len(bvals)), bvals, bvecs, device="cpu")
    tensor = fit.tensor.reshape(*grid, 6).astype(np.float32)
    fa = fit.fa.reshape(grid)
    mask = (fractions.max(-1) >= 0.5) & (fa >= 0.2)
    return shapes, tensor, fractions, mask


def end_regions(shape, mask):
    centres = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in mask.shape], indexing="ij"), -1)
    dist, s, _ = shape.locate(centres)
    near = mask & (dist <= shape.radius + 0.5)
    return near & (s < END_VOXELS), near & (s > shape.length - END_VOXELS)


def inside_bundle(shape, points: np.ndarray) -> bool:
    dist, s, _ = shape.locate(points)
    ok = (dist <= shape.radius + INSIDE_SLACK) & (s >= -INSIDE_SLACK) & (s <= shape.length + INSIDE_SLACK)
    return bool(ok.all())


def auc(true_scores: np.ndarray, false_scores: np.ndarray) -> float | None:
    """Mann–Whitney AUC (ties count half); None when one class is empty."""
    if len(true_scores) == 0 or len(false_scores) == 0:
        return None
    both = np.concatenate([true_scores, false_scores])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(len(both))
    ranks[order] = np.arange(1, len(both) + 1)
    for value in np.unique(both):  # average ranks of ties
        tied = both == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    n1, n0 = len(true_scores), len(false_scores)
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


# ------------------------------------------------------------------------------- scoring
def score_bundle(setting, shapes, k, tensor, mask, metric, options: dict, device: str) -> dict:
    from tractlens.app.pipelines.track import TensorField, geodesic_pipeline
    from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams

    shape = shapes[k]
    seed, target = end_regions(shape, mask)
    if not seed.any() or not target.any():
        return {"setting": setting.label, "bundle": k, "metric": metric, "error": "empty seed or target ROI"}
    affine = np.diag([setting.voxel_mm] * 3 + [1.0])
    field_ = TensorField.from_tensor(tensor, affine)
    options = dict(options)
    params = GeodesicParams(
        **{k_: options.pop(k_) for k_ in list(options) if k_ in GeodesicParams.__dataclass_fields__}
    )
    metric_params = MetricParams(metric=metric, **{k_: options.pop(k_) for k_ in list(options)
                                                   if k_ in MetricParams.__dataclass_fields__})  # fmt: skip
    t0 = time.perf_counter()
    result = geodesic_pipeline(field_, seed_mask=seed, target=target, mask=mask, metric=metric_params,
                               params=params, device=device, **options)  # fmt: skip
    seconds = time.perf_counter() - t0
    tract, prov = result.tractogram, result.provenance
    cm = tract.streamline_scalars["cm"] if len(tract) else np.zeros(0)
    inside = np.array([inside_bundle(shape, tract[i]) for i in range(len(tract))], bool)
    # a seed point is connected when one of its fibres (two-point: one of its pairs) reached the target
    seed_points = tract.streamline_scalars["seed_point"] if len(tract) else np.zeros(0)
    connected = len(np.unique(seed_points)) / prov["seed_points"]
    top = np.argsort(-cm, kind="stable")[: max(1, math.ceil(0.2 * len(cm)))] if len(cm) else np.zeros(0, int)
    return {
        "setting": setting.label,
        "bundle": k,
        "metric": metric,
        "seed_points": prov["seed_points"],
        "fibres": prov.get("fibers"),
        "reached": len(tract),
        "connected": connected,
        "top20_inside": float(inside[top].mean()) if len(top) else 0.0,
        "auc": auc(cm[inside], cm[~inside]),
        "true": int(inside.sum()),
        "false": int((~inside).sum()),
        "stop_reasons": prov.get("stop_reasons"),
        "mask_excursions": prov.get("mask_excursions"),
        "seconds": round(seconds, 2),
    }


QUICK = [
    Setting("arc", 10, 2, 2.0, 20),
    Setting("arc", 20, 4, 1.25, 10),
    Setting("arc", 30, 3, 2.0, 15),
    Setting("arc", 50, 6, 2.0, 30),
    Setting("arc", 40, 2, 1.25, 20),
    Setting("arc", 15, 6, 1.25, 30),
    Setting("crossing", 30, 4, 2.0, 20),
    Setting("kissing", 20, 4, 2.0, 20),
]


def full_settings() -> list[Setting]:
    out = []
    for kind in ("arc", "crossing", "kissing"):
        for r in (10, 20, 30, 50):
            for w in (2, 4, 6):
                for vox, snr in ((2.0, 10), (1.25, 30)):
                    out.append(Setting(kind, r, w, vox, snr))
    return out


def summarise(rows: list[dict]) -> dict:
    out = {}
    for metric in sorted({r["metric"] for r in rows}):
        mine = [r for r in rows if r["metric"] == metric and "error" not in r]
        aucs = [r["auc"] for r in mine if r["auc"] is not None]
        out[metric] = {
            "bundles": len(mine),
            "connected_mean": float(np.mean([r["connected"] for r in mine])),
            "connected_min": float(np.min([r["connected"] for r in mine])),
            "top20_inside_mean": float(np.mean([r["top20_inside"] for r in mine])),
            "top20_inside_min": float(np.min([r["top20_inside"] for r in mine])),
            "auc_mean": float(np.mean(aucs)) if aucs else None,
            "auc_min": float(np.min(aucs)) if aucs else None,
            "auc_defined": len(aucs),
            "seconds": float(sum(r["seconds"] for r in mine)),
        }
    return out


def markdown(rows: list[dict], summary: dict) -> str:
    def fmt(v):
        return "n/a" if v is None else f"{v:.2f}"

    lines = ["| metric | bundles | connected (mean / min) | top-20 % inside (mean / min) | CM AUC (mean / min, defined) |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for metric, s in summary.items():
        lines.append(
            f"| {metric} | {s['bundles']} | {fmt(s['connected_mean'])} / {fmt(s['connected_min'])} | "
            f"{fmt(s['top20_inside_mean'])} / {fmt(s['top20_inside_min'])} | "
            f"{fmt(s['auc_mean'])} / {fmt(s['auc_min'])}, {s['auc_defined']} |"
        )
    lines += ["", "| setting | bundle | metric | seed points | reached | connected | top-20 % inside | AUC (true/false) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['setting']} | {r['bundle']} | {r['metric']} | {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['setting']} | {r['bundle']} | {r['metric']} | {r['seed_points']} | {r['reached']} | "
            f"{r['connected']:.2f} | {r['top20_inside']:.2f} | {fmt(r['auc'])} ({r['true']}/{r['false']}) |"
        )
    return "\n".join(lines) + "\n"


def parse_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="the full grid of settings (long)")
    parser.add_argument("--metrics", nargs="+", default=["adjugate", "inverse"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--two-point", action="store_true")
    parser.add_argument("--method", default=None, help="rays, eikonal or auto (the pipeline's default when not given)")
    parser.add_argument(
        "--mask-dilation",
        type=int,
        default=0,
        help="grow the tight mask by this many voxels (a white-matter mask broader than the bundle)",
    )
    parser.add_argument("--only", nargs="*", type=int, help="indices of the settings to run")
    parser.add_argument("--option", nargs="*", default=[], help="name=value for the pipeline or its parameters")
    parser.add_argument("--out", default=str(ROOT / "tests/benchmarks/results/geodesic_validation"))
    args = parser.parse_args(argv)
    options = {k: parse_value(v) for k, v in (o.split("=", 1) for o in args.option)}
    if args.two_point:
        options["two_point"] = True
    if args.method:
        options["method"] = args.method
    settings = full_settings() if args.full else QUICK
    if args.only:
        settings = [settings[i] for i in args.only]
    rows = []
    for setting in settings:
        shapes, tensor, _fractions, mask = phantom(setting)
        if args.mask_dilation:
            from scipy.ndimage import binary_dilation

            mask = binary_dilation(mask, iterations=args.mask_dilation)
        for k in range(len(shapes)):
            for metric in args.metrics:
                row = score_bundle(setting, shapes, k, tensor, mask, metric, options, args.device)
                rows.append(row)
                print(json.dumps({key: row.get(key) for key in ("setting", "bundle", "metric", "reached", "connected",
                                                                 "top20_inside", "auc", "true", "false", "seconds")}),
                      flush=True)  # fmt: skip
    summary = summarise(rows)
    report = {
        "options": options,
        "mask_dilation": args.mask_dilation,
        "device": args.device,
        "summary": summary,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    out.with_suffix(".md").write_text(markdown(rows, summary))
    print(markdown([], summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
