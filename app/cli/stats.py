"""``tractlens stats``: the statistics of a tractogram and/or an ROI (:mod:`app.statistics`) with
the scalar maps given, as CSV or JSON."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..io.outputs import check_output_file
from ..statistics import StatisticsParams
from ._common import EXIT_OK, emit
from .options import add_params, params_from_args

FORMATS = (".csv", ".json")


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "stats",
        parents=[common],
        help="statistics of a tractogram and/or an ROI: streamlines, length, volume, scalar maps (CSV/JSON)",
        description="A tractogram: streamlines, length mean ± sd (mm), volume of the voxels its points visit "
        "(mm³) and mean ± sd of each --map along it. An ROI: voxels, volume (mm³) and mean ± sd of each --map "
        "inside it. -o writes CSV (subject, kind, quantity, value, sd, unit) or JSON, by its suffix.",
    )
    p.add_argument("tractogram", nargs="?", help=".trk, .tck or .trx (optional with --roi)")
    p.add_argument("--roi", help="ROI mask NIfTI (non-zero = inside)")
    p.add_argument("--map", action="append", default=[], metavar="NIFTI", help="scalar map (FA, MD…); repeatable")
    add_params(p, StatisticsParams)
    p.add_argument("-o", "--output", required=True, help="statistics .csv or .json")
    p.set_defaults(func=cmd_stats)


def cmd_stats(args) -> int:
    from ..io import load_mask, load_tractogram
    from ..io._atomic import write_text_atomic
    from ..io.nifti import load_image, load_volume
    from ..statistics import file_statistics, statistics_csv_text, statistics_json_text

    params = params_from_args(StatisticsParams, args)
    output = Path(args.output)
    if output.suffix.lower() not in FORMATS:
        raise InputError(f"unknown statistics format {output.suffix or '(none)'}", path=output,
                         fix="Name the output .csv or .json")  # fmt: skip
    check_output_file(output, "statistics file")
    maps = {}
    for path in args.map:
        volume = load_volume(path)
        maps[Path(path).name.split(".")[0]] = volume
    roi = None
    if args.roi:
        roi = (Path(args.roi).name.split(".")[0], load_mask(args.roi, what="ROI mask"), load_image(args.roi).affine)
    tract = None
    if args.tractogram:
        tract = load_tractogram(args.tractogram, reference=args.roi or (args.map[0] if args.map else None))
        tract.name = Path(args.tractogram).name
    tables = file_statistics(tract, roi, maps, params)
    text = statistics_json_text(tables) if output.suffix.lower() == ".json" else statistics_csv_text(tables)
    write_text_atomic(text, output)
    summary = {"output": str(output), "tables": [table.as_dict() for table in tables]}
    human = "; ".join(f"{t.subject}: " + ", ".join(f"{q.name} {q.text}" for q in t.quantities[:3]) for t in tables)
    emit(args, summary, f"{human}; written to {output}")
    return EXIT_OK
