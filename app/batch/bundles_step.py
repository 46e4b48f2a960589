"""The batch step ``bundles``: named bundles of one subject through the use case
:func:`tractlens.app.bundles.run_bundles`, imported when the step runs.

The step reads the subject's bedpostX-style samples (fit-ballstick) and its DWI → MNI registration
(the register step) and writes the bundles folder (``bundles.json``, ``NAME.trx``,
``NAME_density.nii.gz``) that the profiles step reads. Its command line is the one of
``tractlens bundles`` (``--samples DIR --registration DIR [--bundles all|NAME,...] [--seed-rng N]
--device D -o OUTDIR``), read here by a parser of its own, so the batch's provenance, skip test and
config checks treat it as any other step; the work is the use case's, called in the worker.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InputError

#: The module holding the use case (the named-bundles package).
BUNDLES_MODULE = "tractlens.app.bundles"


def bundles_parser() -> argparse.ArgumentParser:
    """The options the step's command line may hold (the ones of ``tractlens bundles`` it uses)."""
    parser = argparse.ArgumentParser(prog="tractlens bundles", add_help=False)
    parser.add_argument("--samples", metavar="BEDPOSTX_DIR", required=True)
    parser.add_argument("--registration", metavar="DIR", required=True)
    parser.add_argument("--bundles", default="all", metavar="all|NAME,...", help="bundles to track (default all)")
    parser.add_argument("--seed-rng", type=int, default=None, metavar="N", help="random seed (same seed, same files)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("-o", "--output", required=True, metavar="OUTDIR")
    parser.set_defaults(func=run_bundles_step)
    return parser


def bundle_names_of(text: str) -> list[str] | None:
    """``all`` → None (every bundle); ``CST_L,AF_R`` → the names."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    return None if not names or names == ["all"] else names


def bundles_record(args: argparse.Namespace) -> dict:
    """The parameters the step's provenance keeps (and its skip test compares)."""
    return {"BundlesStep": {"bundles": bundle_names_of(args.bundles), "seed_rng": args.seed_rng}}


def run_bundles_step(args: argparse.Namespace) -> int:
    """Run the use case for one subject and print its summary as JSON (the task reads it)."""
    import importlib

    try:
        module = importlib.import_module(BUNDLES_MODULE)
    except ImportError as exc:
        raise InputError(
            f"the bundles step needs {BUNDLES_MODULE} ({exc})",
            fix="Install a TractLens with named bundles (tractlens bundles --list must work)",
        ) from None
    from ..cli._common import Progress
    from ..jobs import JobContext

    progress = Progress("bundles", "steps", quiet=args.quiet)  # relayed to the cohort display by the batch
    result = module.run_bundles(
        registration=Path(args.registration),
        output=Path(args.output),
        samples=Path(args.samples),
        names=bundle_names_of(args.bundles),
        device=args.device,
        seed_rng=args.seed_rng,
        context=JobContext(on_progress=lambda done, total, message: progress(done, total)),
    )
    print(json.dumps(_summary_of(result, Path(args.output)), default=str))
    return 0


def _summary_of(result, output: Path) -> dict:
    """The bundles' counts and statuses from the folder's ``bundles.json`` (what the use case
    wrote), with the result's own summary when it has one."""
    summary = {"output": str(output)}
    if isinstance(getattr(result, "summary", None), dict):
        summary.update(result.summary)
    try:
        manifest = json.loads((output / "bundles.json").read_text())
    except (OSError, ValueError):
        raise InputError("the bundles step wrote no readable bundles.json", path=output) from None
    summary["bundles"] = {
        name: {k: info.get(k) for k in ("status", "streamlines", "message")}
        for name, info in manifest.get("bundles", {}).items()
    }
    return summary
