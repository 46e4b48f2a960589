"""``tractlens track deterministic --fod`` and ``tractlens track fod-probabilistic``: tracking on
fODFs (:mod:`app.pipelines.track_fod`), with the seeding, regions and streamed output of
``track deterministic``."""

from __future__ import annotations

from tractlens.gpu.backend import DEVICES, check_device
from tractlens.gpu.deterministic import DeterministicParams
from tractlens.gpu.fod_params import FodDeterministicParams, FodProbabilisticParams
from tractlens.gpu.params import default_of

from ..errors import InputError
from ..io.fod import BASES
from ..params import SeedingParams, TractogramOutputParams
from ..timing import phase
from ._common import log
from .options import add_params, params_from_args
from .track_output import regions_from_args, report_tracking, track_to_file, tractogram_output

FOD_HELP = "fODF: a fit-csd output folder (its fod.nii.gz) or an fODF image of MRtrix3 or DIPY"
#: Options of ``track deterministic`` that only tensor tracking reads.
TENSOR_ONLY = ("fa_threshold", "integrator", "method", "tensorline_puncture")


def add_fod_source(parser, source_group) -> None:
    """``--fod`` beside ``--tensor``/``--dwi`` of ``track deterministic``, with its options."""
    source_group.add_argument(
        "--fod", metavar="DIR_OR_FILE", help=FOD_HELP + "; follows the fODF peak nearest the incoming direction"
    )
    _fod_file_options(parser)
    add_params(parser, FodDeterministicParams, only=("cutoff",))


def _fod_file_options(parser) -> None:
    parser.add_argument(
        "--basis",
        choices=BASES,
        default="auto",
        help="SH basis of an fODF image whose header does not say it (default: auto, from the header)",
    )


def add_fod_probabilistic(methods, common) -> None:
    p = methods.add_parser(
        "fod-probabilistic",
        parents=[common],
        help="probabilistic tracking on fODFs (iFOD1): directions drawn ∝ fODF amplitude within the max angle",
        description="From every seed, one streamline in both directions; each step draws its direction in the "
        "cone of --max-angle about the incoming one with probability proportional to the fODF amplitude^--power "
        "(rejection sampling, at most --max-trials draws), and ends where the fODF falls below --cutoff, on the "
        "mask, stop regions and max length. Reproducible with --seed-rng (seed placement and draws).",
    )
    p.add_argument("--fod", metavar="DIR_OR_FILE", required=True, help=FOD_HELP)
    _fod_file_options(p)
    seeding = p.add_mutually_exclusive_group(required=True)
    seeding.add_argument("--seed", metavar="MASK", help="seed region (NIfTI mask)")
    seeding.add_argument(
        "--whole-brain", action="store_true", help="seed every voxel of the mask where the fODF reaches --cutoff"
    )
    _region_options(p)
    add_params(p, SeedingParams, exclude=("rng_seed",))
    add_params(p, FodProbabilisticParams)
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    add_params(p, SeedingParams, only=("rng_seed",))
    p.add_argument(
        "-o", "--output", required=True, help="output tractogram (.trk, .tck or .trx), written while tracking"
    )
    add_params(p, TractogramOutputParams)
    p.set_defaults(func=cmd_track_fod_probabilistic)


def _region_options(p) -> None:
    p.add_argument("--mask", help="tracking mask: streamlines stop on leaving it (default: where the fODF is)")
    p.add_argument("--stop", action="append", metavar="MASK", help="stop region: streamlines end inside it (repeat)")
    p.add_argument(
        "--include", action="append", metavar="MASK", help="waypoint/target: keep streamlines passing it (repeat: all)"
    )
    p.add_argument("--exclude", action="append", metavar="MASK", help="drop streamlines passing it (repeat)")


def _fix(args) -> str:
    return f"Check the tracking options (see tractlens track {args.method} --help)"


def cmd_track_deterministic_fod(args) -> int:
    """``track deterministic --fod``: the tensor command's step, angle and length options, on the fODF."""
    if args.bval or args.bvec or args.tensor_order:
        raise InputError("--bval, --bvec and --tensor-order belong to --dwi/--tensor", fix="Drop them with --fod")
    tensor = params_from_args(DeterministicParams, args, fix=_fix(args))
    ignored = [name for name in TENSOR_ONLY if getattr(tensor, name) != default_of(DeterministicParams, name)]
    if ignored:
        log.warning("with --fod these tensor options have no effect: %s", ", ".join(ignored))
    shared = {name: getattr(tensor, name) for name in ("step_mm", "max_angle_deg", "min_length_mm", "max_length_mm")}
    params = params_from_args(
        FodDeterministicParams, args, fix=_fix(args), keep_truncated=tensor.keep_truncated, **shared
    )
    return _track_fod_to_file(args, params)


def cmd_track_fod_probabilistic(args) -> int:
    return _track_fod_to_file(args, params_from_args(FodProbabilisticParams, args, fix=_fix(args)))


def _track_fod_to_file(args, params) -> int:
    """Track and write at once, batch by batch (as ``track deterministic``)."""
    from ..io.tractogram import check_output_suffix
    from ..pipelines.track_fod import fod_tracking_pipeline, load_fod_volume

    check_device(args.device)
    check_output_suffix(args.output)
    seeding = params_from_args(SeedingParams, args, fix=_fix(args))
    output = tractogram_output(args, _fix(args))
    with phase("read"):
        volume = load_fod_volume(args.fod, args.basis, args.device)
        notes: list[str] = []
        regions = regions_from_args(args, volume, notes)
    result = track_to_file(args, fod_tracking_pipeline, volume, output, seeding, notes, params=params, **regions)
    return report_tracking(args, result)
