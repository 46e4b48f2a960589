"""``tractlens track deterministic|geodesic|probabilistic``: the three trackers (``deterministic --fod``
and ``fod-probabilistic``, tracking on fODFs, are in :mod:`.track_fod`)."""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

from tractlens.gpu.backend import DEVICES, check_device
from tractlens.gpu.deterministic import DeterministicParams
from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams
from tractlens.gpu.params import default_of
from tractlens.gpu.probabilistic_params import ProbParams

from ..errors import InputError
from ..io.outputs import check_output_folder
from ..params import GeodesicSeedingParams, ProbOutputParams, SeedingParams, TractogramOutputParams
from ..timing import phase
from ._common import EXIT_OK, Progress, emit, log, warm_up_gpu_in_background
from .options import add_params, params_from_args
from .track_fod import add_fod_probabilistic, add_fod_source, cmd_track_deterministic_fod
from .track_output import regions_from_args, report_tracking, track_to_file, tractogram_output

#: Where the parser keeps the geodesic ``--step`` in mm (GeodesicParams.step is in voxels).
GEODESIC_STEP_MM = "geodesic_step_mm"


def add_parsers(sub, common) -> None:
    track = sub.add_parser(
        "track", help="tractography: deterministic tensor tracking, geodesic ray tracing, probabilistic (probtrackx)"
    )
    methods = track.add_subparsers(dest="method", metavar="METHOD", required=True)
    _add_deterministic(methods, common)
    _add_geodesic(methods, common)
    _add_probabilistic(methods, common)
    add_fod_probabilistic(methods, common)


def _add_deterministic(methods, common) -> None:
    p = methods.add_parser(
        "deterministic",
        parents=[common],
        help="follow the main eigenvector of the tensor field from seeds",
        description="Deterministic tensor tracking: trilinear tensor interpolation, main eigenvector with "
        "sign continuity, Euler or RK4 steps in mm; stops on FA, angle, mask, stop regions and max length. "
        "Seeds are random (or on a grid) within each seed voxel, reproducible with --seed-rng. "
        "With --fod it follows the fODF peak nearest the incoming direction instead (MRtrix's SD_STREAM).",
    )
    add_fod_source(p, _tensor_source_options(p))
    seeding = p.add_mutually_exclusive_group(required=True)
    seeding.add_argument("--seed", metavar="MASK", help="seed region (NIfTI mask)")
    seeding.add_argument(
        "--whole-brain", action="store_true", help="seed every voxel of the mask with FA ≥ --fa-threshold"
    )
    p.add_argument("--mask", help="tracking mask: streamlines stop on leaving it (default: the fitted voxels)")
    p.add_argument("--stop", action="append", metavar="MASK", help="stop region: streamlines end inside it (repeat)")
    p.add_argument(
        "--include", action="append", metavar="MASK", help="waypoint/target: keep streamlines passing it (repeat: all)"
    )
    p.add_argument("--exclude", action="append", metavar="MASK", help="drop streamlines passing it (repeat)")
    add_params(p, SeedingParams, exclude=("rng_seed",))
    add_params(p, DeterministicParams)
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    add_params(p, SeedingParams, only=("rng_seed",))
    p.add_argument(
        "-o", "--output", required=True, help="output tractogram (.trk, .tck or .trx), written while tracking"
    )
    add_params(p, TractogramOutputParams)
    p.set_defaults(func=cmd_track_deterministic)


def _add_geodesic(methods, common) -> None:
    p = methods.add_parser(
        "geodesic",
        parents=[common],
        help="geodesic ray tracing in the inverse-tensor metric, with the connectivity measure (CM)",
        description="Shoots fibres in many directions from every seed point along geodesics of the metric "
        "G = D^-1 (pre-processed: gain, positive-definite repair, optional sharpening). With --target only "
        "fibres reaching it are kept, ranked by CM where they enter it; CM is stored per point and per "
        "streamline. --step is in mm, like track deterministic's (--step-vox gives it in voxels of the "
        "smallest voxel size instead); stopping rules given as 0 are off.",
    )
    _tensor_source_options(p)
    p.add_argument("--seed", metavar="MASK", required=True, help="seed region (NIfTI mask)")
    p.add_argument("--target", metavar="MASK", help="target region: keep only fibres reaching it, ranked by CM")
    p.add_argument("--mask", help="tracking mask: fibres stop on leaving it (default: the fitted voxels)")
    add_params(p, GeodesicSeedingParams, exclude=("rng_seed", "top_percent"))
    step = p.add_mutually_exclusive_group()
    step.add_argument(
        "--step",
        "--step-mm",
        dest=GEODESIC_STEP_MM,
        type=float,
        metavar="MM",
        help=f"step length in mm (default: {default_of(GeodesicParams, 'step'):g} voxel of the smallest voxel size)",
    )
    add_params(step, GeodesicParams, only=("step",))
    add_params(p, GeodesicParams, exclude=("step",))
    add_params(p, MetricParams)
    add_params(p, GeodesicSeedingParams, only=("top_percent",))
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    add_params(p, GeodesicSeedingParams, only=("rng_seed",))
    p.add_argument("-o", "--output", required=True, help="output tractogram (.trk, .tck or .trx)")
    p.set_defaults(func=cmd_track_geodesic)


def _add_probabilistic(methods, common) -> None:
    p = methods.add_parser(
        "probabilistic",
        parents=[common],
        help="probtrackx-style probabilistic tracking from a bedpostX folder",
        description="From every seed voxel, --nsamples streamlines start at random points and run both ways; "
        "each step draws a posterior sample of a neighbouring voxel (trilinear probabilities) and follows the "
        "stick best aligned with the previous direction. Writes fdt_paths.nii.gz (each kept streamline counts "
        "a voxel once), waytotal, seeds_to_{target}.nii.gz and matrix_seeds_to_all_targets.csv/.npy. "
        "Defaults are probtrackx2's. Masks on another grid are resampled to the samples' (nearest neighbour).",
    )
    p.add_argument(
        "--samples",
        required=True,
        metavar="BEDPOSTX_DIR",
        help="bedpostX folder (ours or FSL's), or FSL's base name DIR/merged",
    )
    p.add_argument("--seed", required=True, metavar="MASK", help="seed mask: --nsamples streamlines per voxel")
    p.add_argument("--target", action="extend", nargs="+", metavar="MASK", help="target masks (seeds_to_{target})")
    p.add_argument("--waypoints", action="extend", nargs="+", metavar="MASK", help="waypoint masks to pass")
    add_params(p, ProbParams, only=("waycond",))
    p.add_argument("--exclude", metavar="MASK", help="exclusion mask: streamlines entering it are discarded")
    p.add_argument("--stop", metavar="MASK", help="stop mask: streamlines end on entering it")
    add_params(p, ProbParams, exclude=("waycond",))
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="N",
        help="share the streamlines out over the first N GPUs of this host (the same counts as on one GPU; "
        "also for the connectome modes). A GPU that fails is named; the others take its share",
    )
    add_params(p, ProbOutputParams, only=("seed_matrix",))
    p.add_argument(
        "--save-paths",
        metavar="F",
        help="also save the kept streamlines as a tractogram (.trx, .trk or .tck), "
        "traced again with the run's random numbers; at most --save-paths-max of them (the first samples of "
        "every seed voxel alike)",
    )
    add_params(p, ProbOutputParams, only=("save_paths_max",))
    _add_connectome_modes(p)
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.set_defaults(func=cmd_track_probabilistic)


def _add_connectome_modes(p) -> None:
    """probtrackx2's connectome modes (app.pipelines.connectome_modes), FSL's flags."""
    g = p.add_argument_group(
        "connectome modes (probtrackx2)",
        "FSL's matrices in its sparse text format (row col value, 1-based, last line: size), with "
        "coords_for_fdt_matrix* and probtrackx.log",
    )
    add_params(g, ProbOutputParams, only=("omatrix2",))
    g.add_argument("--target2", metavar="MASK", help="matrix2 columns: a (low-resolution) mask on its own grid")
    add_params(g, ProbOutputParams, only=("omatrix3",))
    g.add_argument("--target3", metavar="MASK", help="matrix3 rows and columns: the voxels of this mask")
    g.add_argument("--lrtarget3", metavar="MASK", help="matrix3 columns instead: a mask on its own grid")
    add_params(g, ProbOutputParams, only=("network", "distthresh", "distthresh3", "pd", "ompl", "matrix_format"))


def _tensor_source_options(p) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--tensor", metavar="DIR_OR_FILE", help="6-volume tensor NIfTI or dtifit/fit-dti folder")
    source.add_argument("--dwi", help="4-D DWI NIfTI; tensors are fitted first (WLS)")
    p.add_argument("--bval", help="FSL bval file (with --dwi; default: NAME.bval beside it)")
    p.add_argument("--bvec", help="FSL bvec file (with --dwi; default: NAME.bvec beside it)")
    p.add_argument(
        "--tensor-order",
        choices=("fsl", "dipy", "mrtrix"),
        help="element order of a 6-volume tensor file whose header does not say it",
    )
    return source


def _check_track_inputs(args) -> None:
    from ..io.tractogram import check_output_suffix

    check_device(args.device)
    check_output_suffix(args.output)
    if args.tensor and (args.bval or args.bvec):
        raise InputError(
            "--bval/--bvec belong to --dwi; a tensor input needs none", fix="Drop --bval/--bvec, or give --dwi"
        )


def _load_field(args):
    from ..pipelines.track import load_tensor_field

    return load_tensor_field(
        tensor=args.tensor,
        tensor_order=args.tensor_order,
        dwi=args.dwi,
        bval=args.bval,
        bvec=args.bvec,
        mask=args.mask,
        device=args.device,
        progress=Progress("fit-dti", "voxels", quiet=args.quiet),
    )


def _tracking_fix(args) -> str:
    return f"Check the tracking options (see tractlens track {args.method} --help)"


def geodesic_params(args, field_) -> GeodesicParams:
    """The command's :class:`GeodesicParams`: ``--step`` in mm converted to voxels of the tensor
    grid (:func:`step_in_voxels`), or ``--step-vox`` as given."""
    from ..pipelines.track_geodesic import step_in_voxels

    values = {}
    step_mm = getattr(args, GEODESIC_STEP_MM, None)
    if step_mm is not None:
        if not (step_mm > 0 and math.isfinite(step_mm)):  # said in mm, as given (not in voxels)
            raise InputError(f"--step must be positive (a length in mm), got {step_mm:g}", fix="Give e.g. --step 0.5")
        values["step"] = step_in_voxels(step_mm, field_.voxel_size)
    return params_from_args(GeodesicParams, args, fix=_tracking_fix(args), **values)


def cmd_track_geodesic(args) -> int:
    from ..io import save_tractogram
    from ..pipelines.track import geodesic_pipeline, masks_on_field

    _check_track_inputs(args)
    params = params_from_args(GeodesicParams, args, fix=_tracking_fix(args))  # checked before any reading
    metric = params_from_args(MetricParams, args, fix=_tracking_fix(args))
    seeding = params_from_args(GeodesicSeedingParams, args, fix=_tracking_fix(args))
    warm_up_gpu_in_background(args, "geodesic")
    with phase("read"):  # a --dwi is fitted first: that part counts as compute
        field = _load_field(args)
    params = geodesic_params(args, field)
    notes: list[str] = []
    seed = masks_on_field([args.seed], "seed mask", field, notes)[0]
    target = masks_on_field([args.target], "target mask", field, notes)[0] if args.target else None
    # without --mask the fitted voxels, as in the window and for deterministic tracking (fibres ran out of the brain)
    mask = masks_on_field([args.mask], "tracking mask", field, notes)[0] if args.mask else field.mask
    with phase("compute"):
        result = geodesic_pipeline(
            field,
            seed_mask=seed,
            target=target,
            mask=mask,
            metric=metric,
            params=params,
            seeds_per_voxel=seeding.seeds_per_voxel,
            directions=seeding.directions,
            cone_deg=seeding.cone_deg,
            top_percent=seeding.top_percent,
            placement=seeding.placement,
            rng_seed=seeding.rng_seed,
            two_point=seeding.two_point,
            target_points=seeding.target_points,
            method=seeding.method,
            device=args.device,
            progress=Progress("track", "fibres", quiet=args.quiet),
        )
    result.notes[:0] = notes
    for note in result.notes:
        log.warning("%s", note)
    with phase("write"):
        save_tractogram(result.tractogram, args.output)
    prov = result.provenance
    summary = {"output": str(args.output), **result.summary()}
    human = _geodesic_summary(prov, args.output)
    emit(args, summary, human)
    return EXIT_OK


def _geodesic_summary(prov: dict, output) -> str:
    """One line on what a geodesic run did: fibres (or pairs), how they ended, what was written."""
    if "pairs" in prov:
        return (
            f"{prov['pairs']} seed–target pairs, {prov['pairs_joined']} joined "
            f"({prov['seed_points_joined']} of {prov['seed_points']} seed points); {prov['streamlines']} written to "
            f"{output} ({prov['tracking_s']:.2f} s on {prov['backend']})"
        )
    reached = f", {prov['reached_target']} reached the target" if prov["reached_target"] is not None else ""
    endings = ", ".join(f"{n} {reason}" for reason, n in (prov.get("stop_reasons") or {}).items())
    excursions = (
        f"; {prov['mask_excursions']} came back after leaving the mask (up to {prov['longest_mask_excursion_mm']:g} mm)"
        if prov.get("mask_excursions")
        else ""
    )
    return (
        f"{prov['fibers']} fibres{reached}; {prov['streamlines']} written to {output} "
        f"({prov['steps'] / 1e6:.1f} M steps on {prov['backend']} in {prov['tracking_s']:.2f} s); "
        f"ended: {endings or 'none'}{excursions}"
    )


def cmd_track_deterministic(args) -> int:
    """Tracks and writes at once: each batch of streamlines is appended to the output file
    (:mod:`app.io.tractogram_stream`), so a whole-brain run never holds its tractogram."""
    from ..pipelines.track import deterministic_pipeline

    if getattr(args, "fod", None):
        return cmd_track_deterministic_fod(args)
    _check_track_inputs(args)
    params = params_from_args(DeterministicParams, args, fix=_tracking_fix(args))
    seeding = params_from_args(SeedingParams, args, fix=_tracking_fix(args))
    output = tractogram_output(args, _tracking_fix(args))
    warm_up_gpu_in_background(args, "deterministic")
    with phase("read"):  # a --dwi is fitted first: that part counts as compute
        field = _load_field(args)
        notes: list[str] = []
        regions = regions_from_args(args, field, notes)
    result = track_to_file(args, deterministic_pipeline, field, output, seeding, notes, params=params, **regions)
    return report_tracking(args, result)


def cmd_track_probabilistic(args) -> int:
    from ..pipelines.probabilistic import prepare_probabilistic, summarise, write_probabilistic_outputs
    from ..pipelines.track_probabilistic import track_probabilistic

    check_device(args.device)
    params = params_from_args(ProbParams, args, fix=_tracking_fix(args))
    outputs = params_from_args(ProbOutputParams, args, fix=_tracking_fix(args))
    if args.waypoints is None and params.waycond != "AND":
        log.warning("--waycond has no effect without --waypoints")
    check_output_folder(args.output)
    if args.save_paths is not None:
        from ..io.tractogram import check_output_suffix

        check_output_suffix(args.save_paths)
        if outputs.save_paths_max < 1:
            raise InputError("--save-paths-max must be at least 1", fix="Give how many streamlines to save, e.g. 10000")
    from ..pipelines.connectome_modes import wants_connectome

    if args.gpus < 1:
        raise InputError(f"--gpus must be at least 1, got {args.gpus}", fix="Give how many GPUs to use, e.g. --gpus 2")
    if args.gpus > 1 and args.device != "cpu":  # the other GPUs' contexts made while the files are read
        from tractlens.gpu.multidevice import start_devices

        start_devices(args.gpus)
    if wants_connectome(outputs, args.target2, args.target3, args.lrtarget3):
        return _track_connectome(args, params, outputs)
    warm_up_gpu_in_background(args, "probabilistic")
    with phase("compute"):  # the bedpostX folder and masks read inside count as read
        run = prepare_probabilistic(
            args.samples,
            args.seed,
            targets=args.target or (),
            waypoints=args.waypoints or (),
            exclude=args.exclude,
            stop=args.stop,
            params=params,
            seed_matrix=outputs.seed_matrix,
        )
    for note in run.notes:
        log.warning("%s", note)
    with phase("compute"):
        if args.gpus < 1:
            raise InputError(
                f"--gpus must be at least 1, got {args.gpus}", fix="Give how many GPUs to use, e.g. --gpus 2"
            )
        passes = track_probabilistic(
            run,
            device=args.device,
            gpus=args.gpus,
            first_pass=0,  # nobody watches it fill in: the engine's largest batches
            progress=Progress("probabilistic", "streamlines", quiet=args.quiet),
        )
        result = deque(passes, maxlen=1)[0].result
    with phase("write"):
        files = write_probabilistic_outputs(run, result, args.output)
    summary = {
        "outdir": str(Path(args.output)),
        "files": sorted(Path(f).name for f in files.values()),
        **summarise(run, result),
    }
    if args.save_paths is not None:
        from ..io import save_tractogram

        with phase("compute"):
            tract, traced = run.paths_tractogram(
                outputs.save_paths_max,
                device=args.device,
                progress=Progress("saving paths", "streamlines", quiet=args.quiet),
            )
        with phase("write"):
            save_tractogram(tract, args.save_paths)
        summary["paths_file"] = str(args.save_paths)
        summary["paths_saved"] = len(tract)
        summary["paths_traced"] = traced
        if traced < result.streamlines:
            log.warning(
                "--save-paths: %d of the %d streamlines traced (the first samples of every seed voxel), %d kept and saved",
                traced,
                result.streamlines,
                len(tract),
            )
    human = (
        f"{result.streamlines} streamlines from {len(run.seeds)} seed voxels, {result.waytotal} kept, on "
        f"{result.provenance['backend']} ({result.provenance['device']}) in {result.provenance['tracking_s']:.2f} s; "
        f"written to {args.output}"
    )
    emit(args, summary, human)
    return EXIT_OK


def _track_connectome(args, params, outputs) -> int:
    """The connectome modes: their own run and files (FSL's), with probtrackx.log."""
    import sys

    from ..pipelines.connectome_modes import prepare_connectome, summarise_connectome, write_connectome_outputs

    for flag, given in (
        ("--target", args.target),
        ("--seed-matrix", outputs.seed_matrix),
        ("--save-paths", args.save_paths),
    ):
        if given:
            raise InputError(
                f"{flag} cannot be combined with the connectome modes (--omatrix2/3, --network, --pd, --ompl, "
                "--distthresh)",
                fix=f"Run {flag} in a separate tractlens track probabilistic call",
            )
    warm_up_gpu_in_background(args, "probabilistic")
    with phase("compute"):
        run = prepare_connectome(
            args.samples,
            args.seed,
            options=outputs,
            target2=args.target2,
            target3=args.target3,
            lrtarget3=args.lrtarget3,
            waypoints=args.waypoints or (),
            exclude=args.exclude,
            stop=args.stop,
            params=params,
        )
    for note in run.prob.notes:
        log.warning("%s", note)
    with phase("compute"):
        result = run.track(device=args.device, gpus=args.gpus,
                           progress=Progress("probabilistic", "streamlines", quiet=args.quiet))  # fmt: skip
    with phase("write"):
        files = write_connectome_outputs(run, result, args.output, argv=["tractlens", *sys.argv[1:]])
    summary = {"outdir": str(Path(args.output)), "files": sorted(Path(f).name for f in files.values())}
    summary |= summarise_connectome(run, result)
    matrices = ", ".join(f"{name} {m['nonzeros']} non-zeros" for name, m in summary["matrices"].items())
    prov = result.provenance
    human = (
        f"{result.streamlines} streamlines from {len(run.prob.seeds)} seed voxels, {int(result.waytotal.sum())} kept"
        f"{'; ' + matrices if matrices else ''}; on {prov['backend']} ({prov['device']}) in {prov['tracking_s']:.2f} s; "
        f"written to {args.output}"
    )
    emit(args, summary, human)
    return EXIT_OK
