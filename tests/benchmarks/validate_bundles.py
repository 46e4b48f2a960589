"""Validation: every named bundle on the MNI phantom (app.bundles.phantom), share of its streamlines
inside its true tube, per engine.

    PYTHONPATH=. python tests/benchmarks/validate_bundles.py                       # probabilistic, CPU, small
    PYTHONPATH=. python tests/benchmarks/validate_bundles.py --device gpu --nsamples 1000 --engines all

The phantom: every bundle a tube of radius 4 mm along its textbook course through its protocol's
regions, 2.5 mm grid, bedpostX-style samples (3 fibres, 16 samples, 6° dispersion), a tensor and an
fODF, and an identity registration to MNI. A streamline is inside its true bundle when at least
90 % of its points lie within the tube's radius plus one voxel of the course; the target is at least
80 % of each bundle's streamlines. Writes tests/benchmarks/results/bundles_validation.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tractlens.app.bundles import bundle_names, run_bundles  # noqa: E402
from tractlens.app.bundles.phantom import (  # noqa: E402
    make_phantom,
    phantom_grid,
    share_inside,
    write_bedpostx,
    write_fod,
    write_identity_registration,
    write_tensor,
)
from tractlens.app.params import BundleParams, FodProbabilisticParams, ProbParams  # noqa: E402

RADIUS_MM, VOXEL_MM, TARGET = 4.0, 2.5, 0.8
INPUTS = {"probabilistic": ("samples", "bpx"), "fod": ("fod", "csd"), "deterministic": ("tensor", "dti")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engines", default="probabilistic", help="comma-separated, or all")
    parser.add_argument("--nsamples", type=int, default=10, help="probabilistic: samples per seed voxel")
    parser.add_argument("--keep", type=int, default=300, help="streamlines kept per bundle (probabilistic)")
    parser.add_argument("--bundles", default="all")
    parser.add_argument("--out", default=str(ROOT / "tests/benchmarks/results/bundles_validation.json"))
    args = parser.parse_args()
    os.environ.setdefault("TRACTLENS_BEDPOSTX_CACHE", "0")
    engines = list(INPUTS) if args.engines == "all" else args.engines.split(",")
    names = bundle_names() if args.bundles == "all" else args.bundles.split(",")
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": platform.node(),
        "device": args.device,
        "criterion": f"streamline inside when >= 90 % of its points lie within {RADIUS_MM} mm + one voxel "
        f"({VOXEL_MM} mm) of the course; target: >= {TARGET:.0%} of each bundle's streamlines",
        "engines": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        phantom = make_phantom(bundle_names(), phantom_grid(VOXEL_MM), radius_mm=RADIUS_MM)
        write_identity_registration(phantom.grid, folder / "reg")
        writers = {"bpx": lambda p: write_bedpostx(phantom, p, n_samples=16), "csd": lambda p: write_fod(phantom, p),
                   "dti": lambda p: write_tensor(phantom, p)}  # fmt: skip
        for engine in engines:
            keyword, sub = INPUTS[engine]
            writers[sub](folder / sub)
            t0 = time.perf_counter()
            result = run_bundles(
                registration=folder / "reg", output=folder / f"out_{engine}", names=names, device=args.device,
                params=BundleParams(keep_streamlines=args.keep, seeds_per_voxel=5),
                prob_params=ProbParams(n_samples=args.nsamples, step_mm=1.0, n_steps=300),
                fod_params=FodProbabilisticParams(step_mm=1.0), seed_rng=0, **{keyword: folder / sub},
            )  # fmt: skip
            rows = {}
            for name, outcome in result.bundles.items():
                tract = outcome.tractogram
                share = None
                if tract is not None and len(tract):
                    points = tract.points @ tract.affine[:3, :3].T + tract.affine[:3, 3]
                    share = share_inside(name, points, tract.offsets, RADIUS_MM, VOXEL_MM, point_share=0.9)[0]
                rows[name] = {"status": outcome.status, "streamlines": outcome.record["streamlines"],
                              "waytotal": outcome.record["waytotal"], "share_inside": share,
                              "passes": share is not None and share >= TARGET}  # fmt: skip
                print(f"{engine:14s} {name:7s} {outcome.status:15s} {share if share is not None else float('nan'):.3f}")
            report["engines"][engine] = {
                "seconds": time.perf_counter() - t0,
                "all_pass": all(r["passes"] for r in rows.values()),
                "bundles": rows,
            }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {args.out}")
    return 0 if all(e["all_pass"] for e in report["engines"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
