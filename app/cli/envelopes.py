"""``tractlens envelopes``: a tract's uncertainty envelopes from a probabilistic tracking output
folder (:mod:`app.envelopes`), and the lesion-to-envelope distances of ``tractlens distance
--envelopes``."""

from __future__ import annotations

from ..envelopes import LEVEL_MEANING
from ..params import EnvelopeParams
from ._common import EXIT_OK, emit
from .options import add_params, params_from_args


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "envelopes",
        parents=[common],
        help="uncertainty envelopes of a probabilistic tract: one mask per confidence level and envelopes.json",
        description="Each envelope is the smallest region holding the level's share of the normalised "
        "visitation (fdt_paths / its sum): voxels taken most visited first, ties by the smaller index. "
        "The levels are nested. " + LEVEL_MEANING,
    )
    p.add_argument(
        "prob_dir",
        nargs="+",
        metavar="PROB_DIR",
        help="output folder of tractlens track probabilistic (fdt_paths); or tractograms of a bootstrap "
        "(a deterministic or fODF run repeated with other --seed-rng, one file each), their streamlines "
        "counted once per voxel",
    )
    p.add_argument("--reference", metavar="IMAGE", help="the grid for .tck tractograms (a NIfTI of the DWI)")
    add_params(p, EnvelopeParams)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for the masks and envelopes.json")
    p.set_defaults(func=cmd_envelopes)


def cmd_envelopes(args) -> int:
    from pathlib import Path

    from ..errors import InputError
    from ..io.outputs import check_output_folder
    from ..pipelines.envelope_files import envelopes_of_tractograms, make_envelopes, write_envelopes

    params = params_from_args(EnvelopeParams, args)
    folders = [p for p in args.prob_dir if Path(p).is_dir()]
    if folders and len(args.prob_dir) > 1:
        raise InputError(
            "give one probabilistic output folder, or tractograms (not both)",
            path=folders[0],
            fix="Run tractlens envelopes once per probabilistic folder",
        )
    if folders:
        found = make_envelopes(folders[0], params.levels)
    else:
        found = envelopes_of_tractograms(args.prob_dir, params.levels, reference=args.reference)
    check_output_folder(args.output)
    files = write_envelopes(found, args.output)
    source = args.prob_dir[0] if len(args.prob_dir) == 1 else f"{len(args.prob_dir)} tractograms"
    lines = [f"envelopes of {source} (waytotal {found.waytotal}), written to {args.output}:"]
    lines += [f"  {e.label}: {e.voxels} voxels, {e.volume_mm3:.0f} mm3" for e in found.envelopes]
    summary = {"input": [str(p) for p in args.prob_dir], "output": str(args.output), "files": sorted(files),
               "levels": [e.summary() for e in found.envelopes]}  # fmt: skip
    emit(args, summary, "\n".join(lines))
    return EXIT_OK


def cmd_envelope_distance(args) -> int:
    """``tractlens distance --envelopes DIR --lesion MASK``."""
    from ..pipelines.envelope_files import envelope_distances

    distances = envelope_distances(args.envelopes, args.lesion)
    lines = [f"distance from {args.lesion} to the envelopes of {args.envelopes}:"]
    for d in distances:
        where = f"overlaps ({d.overlap_voxels} voxels)" if d.overlap_voxels else f"{d.min_mm:.1f} mm"
        lines.append(f"  {d.level:g} % envelope: {where}")
    lines.append(LEVEL_MEANING)
    summary = {"envelopes": str(args.envelopes), "lesion": str(args.lesion), "meaning": LEVEL_MEANING,
               "levels": [d.as_dict() for d in distances]}  # fmt: skip
    emit(args, summary, "\n".join(lines))
    return EXIT_OK
