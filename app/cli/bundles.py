"""``tractlens bundles``: the major white-matter bundles of a subject, tracked by name from
published protocols (XTRACT) whose MNI regions are warped to the subject (:mod:`app.bundles`)."""

from __future__ import annotations

from ..errors import InputError
from ..params import BundleParams, FodProbabilisticParams, ProbParams
from ._common import EXIT_OK, Progress, emit
from .options import add_params, params_from_args

DEVICES = ("auto", "cpu", "gpu")


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "bundles",
        parents=[common],
        help="track the major bundles by name (CST, AF, SLF, IFOF, ILF, UF, cingulum, ATR, OR, forceps, FAT, VOF)",
        description="Each bundle is a protocol of seed, target (waypoint), exclusion and stop regions in MNI space "
        "after XTRACT (Warrington et al. 2020), warped to the subject through the --registration folder of "
        "'tractlens register DWI mni --type syn'. All chosen bundles are tracked in one run (on the GPU when there is "
        "one): from bedpostX samples (--samples, probtrackx style), an fODF (--fod, iFOD1) or a tensor (--tensor, "
        "deterministic). OUTDIR receives per bundle NAME.trx (streamlines in RAS mm on the subject grid; for "
        "--samples a sample of the kept ones), NAME_density.nii.gz (visits / waytotal, XTRACT's density_norm), and "
        "bundles.json (counts, volumes, status, protocols and their version, provenance). A bundle whose regions "
        "miss the brain or that no streamline completes is reported by name with a warning (status "
        "regions-missed / empty). --list prints the bundles and their protocols.",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--samples", metavar="BEDPOSTX_DIR", help="bedpostX folder: probabilistic tracking")
    source.add_argument("--fod", metavar="CSD_DIR", help="fit-csd folder (or fODF image): iFOD1 tracking")
    source.add_argument("--tensor", metavar="DTI_DIR", help="dtifit / fit-dti folder: deterministic tracking")
    p.add_argument("--registration", metavar="DIR", help="subject ↔ MNI registration folder (tractlens register)")
    p.add_argument("-o", "--output", metavar="OUTDIR", help="output folder (a new one, or an earlier bundles folder)")
    p.add_argument("--bundles", default="all", metavar="all|NAME,...", help="bundles to track (default all)")
    p.add_argument("--list", action="store_true", help="print the bundles and their protocols, and stop")
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    add_params(p.add_argument_group("bundles"), BundleParams)
    add_params(p.add_argument_group("probabilistic engine (--samples)"), ProbParams)
    add_params(p.add_argument_group("fODF and tensor engines (--fod, --tensor)"), FodProbabilisticParams)
    p.set_defaults(func=cmd_bundles)


def _list(args) -> int:
    from ..bundles import load_protocols  # the bundle pipelines: imported when this command runs

    protocols = load_protocols()
    rows = [
        {"name": name, "title": p.title, "protocol": p.protocol, "citation": p.citation, "adapted": p.adapted,
         "colour": list(p.colour), "regions": p.regions()}
        for name, p in protocols.protocols.items()
    ]  # fmt: skip
    human = "\n".join(f"{r['name']:7s} {r['title']}  [{r['protocol']}]" for r in rows)
    cites = sorted({r["citation"] for r in rows})
    human += f"\nprotocols version {protocols.version}\n" + "\n".join(cites)
    emit(args, {"protocols_version": protocols.version, "adaptation": protocols.adaptation, "bundles": rows}, human)
    return EXIT_OK


def cmd_bundles(args) -> int:
    from ..bundles import run_bundles  # the tracking engines: not for every command's start
    from ..jobs import JobContext

    if args.list:
        return _list(args)
    missing = [flag for flag, value in (("--registration", args.registration), ("-o", args.output)) if not value]
    if not (args.samples or args.fod or args.tensor):
        missing.insert(0, "one of --samples, --fod, --tensor")
    if missing:
        raise InputError(
            f"tractlens bundles needs {', '.join(missing)}",
            fix="e.g. tractlens bundles --samples subj.bedpostX --registration reg_mni -o bundles (or --list)",
        )
    fix = "Check the options (see tractlens bundles --help)"
    params = params_from_args(BundleParams, args, fix=fix)
    prob = params_from_args(ProbParams, args, fix=fix)
    fod = params_from_args(FodProbabilisticParams, args, fix=fix)
    progress = Progress("bundles", "bundles", args.quiet)
    context = JobContext(on_progress=lambda done, total, _name: progress(done, total))
    result = run_bundles(
        registration=args.registration, output=args.output, samples=args.samples, fod=args.fod, tensor=args.tensor,
        names=args.bundles, params=params, device=args.device, seed_rng=prob.seed, context=context,
        prob_params=prob, fod_params=fod,
    )  # fmt: skip
    # bundles.json's own "version" (its format) is "format_version" here: "version" is the program's
    summary = {"output": str(result.output), **result.summary, "format_version": result.summary["version"]}
    del summary["version"]
    counts = {}
    for outcome in result.bundles.values():
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    human = (
        f"{len(result.bundles)} bundles ({', '.join(f'{v} {k}' for k, v in counts.items())}) written to {result.output}"
    )
    for outcome in result.problems:
        human += f"\n  {outcome.name}: {outcome.status}"
    emit(args, summary, human)
    return EXIT_OK
