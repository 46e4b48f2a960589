"""The ``tractlens`` command line.

Subcommands call the same pipelines as the GUI. Progress goes to stderr,
``--json`` prints a machine-readable summary on stdout, and bad input ends
with a one-paragraph message and exit status 2 (no traceback; ``--debug``
shows one). Exit status 1 means an internal error, 130 an interrupted run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import DEVICES, BackendError, Cancelled, OutOfDeviceMemory, get_backend, gpu_status
from tractlens.gpu.commit import MODELS as COMMIT_MODELS

from . import __version__
from .errors import InputError
from .io.outputs import check_output_file, check_output_folder
from .pipelines.commit import PEAKS_FRAMES
from .pipelines.connectivity import DEFAULT_MARGIN_MM, DEFAULT_RADIUS_MM, WEIGHTS

log = logging.getLogger("tractlens")

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class Progress:
    """Progress on stderr: a rewritten line on a terminal, a line per 10 % otherwise."""

    def __init__(self, label: str, unit: str, quiet: bool = False):
        self.label, self.unit, self.quiet = label, unit, quiet
        self.tty = sys.stderr.isatty()
        self.last_decile = -1
        self.start = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if self.quiet or total <= 0:
            return
        fraction = done / total
        decile = int(fraction * 10)
        text = f"{self.label}: {fraction:6.1%} ({done}/{total} {self.unit}, {time.perf_counter() - self.start:.1f} s)"
        if self.tty:
            sys.stderr.write("\r" + text + ("\n" if done >= total else ""))
            sys.stderr.flush()
        elif decile != self.last_decile or done >= total:
            self.last_decile = decile
            print(text, file=sys.stderr, flush=True)


def _emit(args, summary: dict, human: str) -> None:
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(human)


def cmd_info(args) -> int:
    ok, detail = gpu_status()
    summary = {"version": __version__, "python": sys.version.split()[0], "gpu_available": ok}
    if ok:
        backend = get_backend("gpu")
        summary.update(
            backend="gpu",
            gpu_name=detail,
            gpu_memory_total_bytes=backend.total_memory_bytes(),
            gpu_memory_free_bytes=backend.free_memory_bytes(),
        )
        human_gpu = f"GPU: {detail}, {backend.free_memory_bytes() / 2**30:.1f} of {backend.total_memory_bytes() / 2**30:.1f} GiB free"
    else:
        summary.update(backend="cpu", gpu_unavailable_reason=detail)
        human_gpu = f"GPU: none ({detail}); computing on the CPU with NumPy"
    import numpy

    summary["numpy"] = numpy.__version__
    _emit(args, summary, f"TractLens {__version__}\nbackend: {summary['backend']}\n{human_gpu}")
    return EXIT_OK


def cmd_demo_data(args) -> int:
    from .demo import write_demo

    out = write_demo(args.outdir)
    files = sorted(p.name for p in out.iterdir())
    _emit(args, {"outdir": str(out), "files": files}, f"demo dataset written to {out} ({len(files)} files)")
    return EXIT_OK


def cmd_fit_dti(args) -> int:
    from tractlens.gpu.dti import DTIFitParams

    from .io import load_dwi
    from .pipelines.dti import fit_dti_pipeline, write_dti_outputs

    get_backend(args.device)  # fail early and clearly when --device gpu has no GPU
    check_output_folder(args.output)  # before the fit, not after it
    dwi = load_dwi(args.dwi, args.bval, args.bvec, b0_threshold=args.b0_threshold)
    for warning in dwi.warnings:
        log.warning("%s", warning)
    params = DTIFitParams(method=args.method, precision=args.precision, b0_threshold=args.b0_threshold)
    result = fit_dti_pipeline(
        dwi,
        mask_path=args.mask,
        params=params,
        device=args.device,
        progress=Progress("fit-dti", "voxels", quiet=args.quiet),
    )
    for warning in result.warnings[len(dwi.warnings) :]:
        log.warning("%s", warning)
    files = write_dti_outputs(result, args.output)
    summary = {
        "outdir": str(Path(args.output)),
        "files": sorted(Path(f).name for f in files.values()),
        **result.summary(),
    }
    fit = result.fit.provenance
    human = (
        f"fitted {summary['voxels_fitted']} voxels ({fit['method'].upper()}, {fit['precision']}) on "
        f"{fit['backend']} ({fit['device']}) in {fit['total_s']:.2f} s; maps written to {args.output}"
    )
    _emit(args, summary, human)
    return EXIT_OK


def cmd_commit(args) -> int:
    from tractlens.gpu.commit import CommitParams

    from .pipelines.commit import commit_from_files, write_commit_outputs

    get_backend(args.device)
    try:
        params = CommitParams(
            model=args.model,
            lambda_=getattr(args, "lambda"),
            max_iter=args.max_iter,
            tol=args.tol,
            radii_um=tuple(args.radii),
            small_delta_ms=args.small_delta,
            big_delta_ms=args.big_delta,
        )
    except ValueError as exc:
        raise InputError(str(exc), fix="Check the COMMIT options (see tractlens commit --help)") from exc
    out = check_output_folder(args.output)
    result, suffix = commit_from_files(
        args.dwi,
        args.tractogram,
        bval=args.bval,
        bvec=args.bvec,
        mask=args.mask,
        peaks=args.peaks,
        peaks_frame=args.peaks_frame,
        params=params,
        device=args.device,
        progress=Progress("commit", "iterations", quiet=args.quiet),
    )
    for note in result.notes:
        log.warning("%s", note)
    files = write_commit_outputs(result, out, suffix)
    summary = {"outdir": str(out), "files": sorted(Path(f).name for f in files.values()), **result.summary()}
    human = (
        f"{summary['kept']} of {summary['streamlines']} streamlines kept (weight > 0), "
        f"{summary['iterations']} FISTA iterations ({summary['stopped']}) on {result.provenance['backend']} "
        f"({result.provenance['device']}) in {result.provenance['fit_s']:.2f} s; written to {out}"
    )
    _emit(args, summary, human)
    return EXIT_OK


def cmd_fit_ballstick(args) -> int:
    from tractlens.gpu.ballstick import BallStickParams

    from .io import load_dwi
    from .pipelines.ballstick import fit_ballstick_pipeline, write_ballstick_outputs

    get_backend(args.device)  # fail early and clearly when --device gpu has no GPU
    try:
        params = BallStickParams(
            n_fibres=args.nfibres,
            burnin=args.burnin,
            njumps=args.njumps,
            sample_every=args.sampleevery,
            ard_weight=args.ard_weight,
            rician=args.rician,
            b0_threshold=args.b0_threshold,
            seed=args.seed_rng,
        )
    except ValueError as exc:
        raise InputError(str(exc), fix="Check the MCMC options (see tractlens fit-ballstick --help)") from exc
    check_output_folder(args.output)
    dwi = load_dwi(args.dwi, args.bval, args.bvec, b0_threshold=args.b0_threshold)
    for warning in dwi.warnings:
        log.warning("%s", warning)
    result = fit_ballstick_pipeline(
        dwi,
        mask_path=args.mask,
        params=params,
        device=args.device,
        progress=Progress("fit-ballstick", "voxels", quiet=args.quiet),
    )
    for warning in result.warnings[len(dwi.warnings) :]:
        log.warning("%s", warning)
    files = write_ballstick_outputs(result, args.output)
    summary = {
        "outdir": str(Path(args.output)),
        "files": sorted(Path(f).name for f in files.values()),
        **result.summary(),
    }
    fit = result.fit.provenance
    human = (
        f"fitted {summary['voxels_fitted']} voxels ({params.n_fibres} sticks, {params.n_samples} samples) on "
        f"{fit['backend']} ({fit['device']}) in {fit['total_s']:.2f} s; bedpostX folder written to {args.output}"
    )
    _emit(args, summary, human)
    return EXIT_OK


def cmd_select(args) -> int:
    from .io import load_tractogram, save_tractogram
    from .io.tractogram import check_output_suffix
    from .pipelines.select import select_pipeline

    get_backend(args.device)
    if not args.include:
        raise InputError("at least one --include mask is needed", fix="Give the region fibers must pass")
    check_output_suffix(args.output)
    tract = load_tractogram(args.tractogram, reference=args.include[0])
    selected, selection, notes = select_pipeline(
        tract,
        args.include,
        args.exclude or [],
        device=args.device,
        progress=Progress("select", "streamlines", quiet=args.quiet),
    )
    for note in notes:
        log.warning("%s", note)
    save_tractogram(selected, args.output)
    summary = {
        "input": str(args.tractogram),
        "output": str(args.output),
        "streamlines": len(tract),
        "selected": len(selected),
        "include": [str(p) for p in args.include],
        "exclude": [str(p) for p in args.exclude or []],
        "passing_each_include": [int(selection.passes(r).sum()) for r in range(len(args.include))],
        "notes": notes,
        **selection.provenance,
    }
    _emit(args, summary, f"kept {len(selected)} of {len(tract)} streamlines; written to {args.output}")
    return EXIT_OK


def cmd_connectome(args) -> int:
    from .io import load_labels, load_tractogram
    from .io.lut import load_lut
    from .io.nifti import load_image
    from .model import Volume
    from .pipelines.connectivity import compute_connectome, write_matrix_csv

    get_backend(args.device)
    check_output_file(args.output, "matrix CSV")
    labels_img = load_image(args.labels, "label volume")
    labels = Volume("labels", load_labels(args.labels), labels_img.affine, kind="labels", source=str(args.labels))
    lut = load_lut(args.lut) if args.lut else None
    weights = _read_weights(args.streamline_weights) if args.streamline_weights else None
    tract = load_tractogram(args.tractogram, reference=args.labels)
    result = compute_connectome(
        tract,
        labels,
        weight=args.weight,
        lut=lut,
        radius_mm=args.radius,
        weights=weights,
        device=args.device,
        progress=Progress("connectome", "streamline ends", quiet=args.quiet),
    )
    write_matrix_csv(result, args.output)
    counts = result.counts
    summary = {
        "input": str(args.tractogram),
        "output": str(args.output),
        "region_names": result.row_names,
        "edges": int(np.count_nonzero(np.triu(counts))),
        "streamlines_in_matrix": int(np.triu(counts).sum()),
        **result.provenance,
    }
    _emit(
        args,
        summary,
        f"{result.provenance['assigned']} of {len(tract)} streamlines join two of {len(result.row_names)} regions "
        f"({summary['edges']} connections); {args.weight} matrix written to {args.output}",
    )
    return EXIT_OK


def _read_weights(path) -> np.ndarray:
    try:
        values = np.loadtxt(path, dtype=np.float64, ndmin=1)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the streamline weights ({exc})", path=path,
                         fix="Give a text file with one number per streamline") from None  # fmt: skip
    if values.ndim != 1 or not np.isfinite(values).all():
        raise InputError(
            "the streamline weights must be one finite number per line",
            path=path,
            fix="Give COMMIT's streamline_weights.txt for this tractogram",
        )
    return values


def cmd_profile(args) -> int:
    from .io import load_tractogram, load_volume
    from .pipelines.connectivity import compute_profile, profile_csv_text, write_text_atomic

    get_backend(args.device)
    check_output_file(args.output, "profile CSV")
    volume = load_volume(args.map)
    tract = load_tractogram(args.tractogram, reference=args.map)
    result = compute_profile(tract, volume, args.points, device=args.device)
    map_name = volume.name
    write_text_atomic(profile_csv_text(result, volume.affine, map_name), args.output)
    summary = {
        "input": str(args.tractogram),
        "map": str(args.map),
        "output": str(args.output),
        "mean": [None if not np.isfinite(v) else float(v) for v in result.mean],
        **result.provenance,
    }
    _emit(
        args,
        summary,
        f"{map_name} profile of {len(tract)} streamlines at {args.points} points "
        f"(mean {np.nanmean(result.mean):.4g}); written to {args.output}",
    )
    return EXIT_OK


def cmd_distance(args) -> int:
    from .io import load_mask, load_tractogram, save_tractogram
    from .io.nifti import load_image
    from .pipelines.connectivity import compute_lesion_distance, distance_row, with_distances

    get_backend(args.device)
    if args.output:
        from .io.tractogram import check_output_suffix

        check_output_suffix(args.output)
    lesion = load_mask(args.lesion, what="lesion mask")
    affine = load_image(args.lesion, "lesion mask").affine
    tract = load_tractogram(args.tractogram, reference=args.lesion)
    distance = compute_lesion_distance(
        tract, lesion, affine, device=args.device, progress=Progress("distance", "streamlines", quiet=args.quiet)
    )
    row = distance_row(Path(args.tractogram).name, distance.per_streamline, args.margin)
    if args.output:
        save_tractogram(with_distances(tract, distance), args.output)
    summary = {"input": str(args.tractogram), "lesion": str(args.lesion), "margin_mm": args.margin,
               "output": args.output, **row.as_dict(), **distance.provenance}  # fmt: skip
    _emit(
        args,
        summary,
        f"closest approach {row.min_mm:.1f} mm; {row.within_margin} of {row.streamlines} streamlines "
        f"({row.percent_within:.1f} %) within {args.margin:g} mm of the lesion",
    )
    return EXIT_OK


def _check_track_inputs(args) -> None:
    from .io.tractogram import check_output_suffix

    get_backend(args.device)
    check_output_suffix(args.output)
    if args.tensor and (args.bval or args.bvec):
        raise InputError(
            "--bval/--bvec belong to --dwi; a tensor input needs none", fix="Drop --bval/--bvec, or give --dwi"
        )


def _load_field(args):
    from .pipelines.track import load_tensor_field

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


def cmd_track_geodesic(args) -> int:
    from tractlens.gpu.geodesic import GeodesicParams, MetricParams

    from .io import save_tractogram
    from .pipelines.track import geodesic_pipeline, masks_on_field

    _check_track_inputs(args)
    try:
        params = GeodesicParams(
            step=args.step,
            integrator=args.integrator,
            max_steps=args.max_steps,
            max_length_mm=args.max_length,
            max_angle_deg=args.max_angle,
            fa_threshold=args.fa_threshold,
            normalize=not args.no_normalize,
            store_every=args.keep_every,
        )
        metric = MetricParams(gain=args.gain, sharpen_power=args.sharpen_power, sharpen_fa=args.sharpen_fa)
    except ValueError as exc:
        raise InputError(
            str(exc), fix=f"Check the tracking options (see tractlens track {args.method} --help)"
        ) from exc
    field = _load_field(args)
    notes: list[str] = []
    seed = masks_on_field([args.seed], "seed mask", field, notes)[0]
    target = masks_on_field([args.target], "target mask", field, notes)[0] if args.target else None
    mask = masks_on_field([args.mask], "tracking mask", field, notes)[0] if args.mask else None
    result = geodesic_pipeline(
        field,
        seed_mask=seed,
        target=target,
        mask=mask,
        metric=metric,
        params=params,
        seeds_per_voxel=args.seeds_per_voxel,
        directions=args.directions,
        cone_deg=args.cone,
        top_percent=args.top_percent,
        placement=args.seed_placement,
        rng_seed=args.seed_rng,
        device=args.device,
        progress=Progress("track", "fibres", quiet=args.quiet),
    )
    result.notes[:0] = notes
    for note in result.notes:
        log.warning("%s", note)
    save_tractogram(result.tractogram, args.output)
    prov = result.provenance
    summary = {"output": str(args.output), **result.summary()}
    reached = f", {prov['reached_target']} reached the target" if prov["reached_target"] is not None else ""
    human = (
        f"{prov['fibers']} fibres{reached}; {prov['streamlines']} written to {args.output} "
        f"({prov['steps'] / 1e6:.1f} M steps on {prov['backend']} in {prov['tracking_s']:.2f} s)"
    )
    _emit(args, summary, human)
    return EXIT_OK


def cmd_track_deterministic(args) -> int:
    from tractlens.gpu.deterministic import DeterministicParams

    from .io import save_tractogram
    from .pipelines.track import deterministic_pipeline, masks_on_field

    _check_track_inputs(args)
    try:
        params = DeterministicParams(
            step_mm=args.step,
            fa_threshold=args.fa_threshold,
            max_angle_deg=args.max_angle,
            min_length_mm=args.min_length,
            max_length_mm=args.max_length,
            integrator=args.integrator,
            method=args.direction,
            tensorline_puncture=args.puncture,
            keep_truncated=not args.discard_truncated,
        )
    except ValueError as exc:
        raise InputError(
            str(exc), fix=f"Check the tracking options (see tractlens track {args.method} --help)"
        ) from exc
    field = _load_field(args)
    notes: list[str] = []
    mask = masks_on_field([args.mask], "tracking mask", field, notes)[0] if args.mask else None
    seed = masks_on_field([args.seed], "seed mask", field, notes)[0] if args.seed else None
    result = deterministic_pipeline(
        field,
        seed_mask=seed,
        whole_brain=args.whole_brain,
        mask=mask,
        stop=masks_on_field(args.stop or [], "stop region", field, notes),
        include=masks_on_field(args.include or [], "include region", field, notes),
        exclude=masks_on_field(args.exclude or [], "exclude region", field, notes),
        params=params,
        seeds_per_voxel=args.seeds_per_voxel,
        placement=args.seed_placement,
        rng_seed=args.seed_rng,
        device=args.device,
        progress=Progress("track", "seeds", quiet=args.quiet),
        notes=notes,
    )
    for note in result.notes:
        log.warning("%s", note)
    save_tractogram(result.tractogram, args.output)
    summary = {"output": str(args.output), **result.summary()}
    prov = result.provenance
    human = (
        f"{prov['streamlines']} streamlines from {prov['seeds']} seeds on {prov['backend']} ({prov['device']}) "
        f"in {prov['tracking_s']:.2f} s; written to {args.output}"
    )
    _emit(args, summary, human)
    return EXIT_OK


def cmd_track_probabilistic(args) -> int:
    from tractlens.gpu.probabilistic import ProbParams

    from .pipelines.probabilistic import prepare_probabilistic, summarise, write_probabilistic_outputs

    get_backend(args.device)
    try:
        params = ProbParams(
            n_samples=args.nsamples,
            step_mm=args.steplength,
            n_steps=args.nsteps,
            cthr=args.cthr,
            fibthresh=args.fibthresh,
            randfib=args.randfib,
            loopcheck=args.loopcheck,
            modeuler=args.modeuler,
            waycond=args.waycond,
            seed=args.seed_rng,
        )
    except ValueError as exc:
        raise InputError(str(exc), fix="Check the tracking options (see tractlens track probabilistic --help)") from exc
    if args.waypoints is None and args.waycond != "AND":
        log.warning("--waycond has no effect without --waypoints")
    check_output_folder(args.output)
    if args.save_paths is not None:
        from .io.tractogram import check_output_suffix

        check_output_suffix(args.save_paths)
        if args.save_paths_max < 1:
            raise InputError("--save-paths-max must be at least 1", fix="Give how many streamlines to save, e.g. 10000")
    run = prepare_probabilistic(
        args.samples,
        args.seed,
        targets=args.target or (),
        waypoints=args.waypoints or (),
        exclude=args.exclude,
        stop=args.stop,
        params=params,
        seed_matrix=args.seed_matrix,
    )
    for note in run.notes:
        log.warning("%s", note)
    result = run.track(device=args.device, progress=Progress("probabilistic", "streamlines", quiet=args.quiet))
    files = write_probabilistic_outputs(run, result, args.output)
    summary = {
        "outdir": str(Path(args.output)),
        "files": sorted(Path(f).name for f in files.values()),
        **summarise(run, result),
    }
    if args.save_paths is not None:
        from .io import save_tractogram

        tract, traced = run.paths_tractogram(
            args.save_paths_max, device=args.device, progress=Progress("saving paths", "streamlines", quiet=args.quiet)
        )
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
    _emit(args, summary, human)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tractlens",
        description="GPU diffusion MRI tractography. Without a command, or with --demo or "
        "'view FILE...', tractlens opens the main window (--screenshot PNG, --size WxH, --exit).",
    )
    parser.add_argument("--version", action="version", version=f"tractlens {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    common.add_argument("--quiet", action="store_true", help="no progress on stderr")
    common.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("info", parents=[common], help="version, backend, GPU name and memory (or why none)")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo-data", parents=[common], help="write the built-in demo phantom to a folder")
    p.add_argument("outdir", help="folder to write into (created if missing)")
    p.set_defaults(func=cmd_demo_data)

    p = sub.add_parser(
        "fit-dti",
        parents=[common],
        help="fit diffusion tensors; write FA, MD, AD, RD, RGB, tensor, V1, L1-L3, mask",
        description="Fit diffusion tensors (WLS by default) and write the maps as NIfTI. "
        "Without --mask, a brain mask is computed from the mean b=0 image "
        "(3x3x3 median filter twice, Otsu threshold, largest connected component, holes filled).",
    )
    p.add_argument("dwi", help="4-D diffusion-weighted NIfTI (.nii or .nii.gz)")
    p.add_argument("--bval", help="FSL bval file (default: NAME.bval beside the image)")
    p.add_argument("--bvec", help="FSL bvec file (default: NAME.bvec beside the image)")
    p.add_argument("--mask", help="brain mask NIfTI on the same grid (default: computed from b=0)")
    p.add_argument("--method", choices=("wls", "ols"), default="wls", help="least-squares fit (default: wls)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument(
        "--precision",
        choices=("auto", "float32", "float64"),
        default="auto",
        help="precision of the products over all volumes (default: float32 on GPU, float64 on CPU)",
    )
    p.add_argument("--b0-threshold", type=float, default=50.0, help="b-values up to this count as b=0 (default 50)")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.set_defaults(func=cmd_fit_dti)

    p = sub.add_parser(
        "fit-ballstick",
        parents=[common],
        help="fit ball & sticks (bedpostX): posterior samples of up to 3 fibre orientations per voxel",
        description="Per voxel: tensor fit, Levenberg-Marquardt on the ball & sticks model, then MCMC "
        "(random-walk Metropolis, adaptive proposals, ARD prior on the fractions of sticks 2..n). Writes a "
        "bedpostX folder (merged_th/ph/f{i}samples, mean_*, dyads{i}, dyads{i}_dispersion, "
        "nodif_brain_mask) that FSL's probtrackx and 'tractlens track probabilistic' read. Defaults are FSL's. "
        "Without --mask, a brain mask is computed from the mean b=0 image.",
    )
    p.add_argument("dwi", help="4-D diffusion-weighted NIfTI (.nii or .nii.gz)")
    p.add_argument("--bval", help="FSL bval file (default: NAME.bval beside the image)")
    p.add_argument("--bvec", help="FSL bvec file (default: NAME.bvec beside the image)")
    p.add_argument("--mask", help="brain mask NIfTI on the same grid (default: computed from b=0)")
    p.add_argument("--nfibres", type=int, default=3, choices=(1, 2, 3), help="sticks per voxel (default 3)")
    p.add_argument("--burnin", type=int, default=1000, help="MCMC iterations before sampling (default 1000)")
    p.add_argument("--njumps", type=int, default=1250, help="MCMC iterations while sampling (default 1250)")
    p.add_argument("--sampleevery", type=int, default=25, help="keep every N-th iteration (default 25: 50 samples)")
    p.add_argument("--ard-weight", type=float, default=1.0, help="ARD prior weight on sticks 2..n (default 1; 0 = off)")
    p.add_argument("--rician", action="store_true", help="Rician noise model (default Gaussian)")
    p.add_argument("--b0-threshold", type=float, default=50.0, help="b-values up to this count as b=0 (default 50)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument(
        "--seed-rng", type=int, default=0, metavar="N", help="random seed (default 0): same seed, same samples"
    )
    p.add_argument("-o", "--output", required=True, help="output folder (the bedpostX folder)")
    p.set_defaults(func=cmd_fit_ballstick)

    p = sub.add_parser(
        "commit",
        parents=[common],
        help="COMMIT filtering: a weight per streamline from the DWI signal; weight 0 is filtered out",
        description="Fits the DWI signal (divided by each voxel's mean b=0 signal) in the voxels the tractogram "
        "passes through (within --mask) as streamlines (sticks, or cylinders of several radii, along their "
        "segments) plus extra-cellular zeppelins (along --peaks, or along the segments) and isotropic balls, "
        "non-negative, with FISTA. Writes streamline_weights.txt, tractogram_filtered.{trk,tck,trx}, "
        "fit_RMSE/fit_NRMSE and compartment_IC/EC/ISO maps, commit.json. COMMIT 2's defaults.",
    )
    p.add_argument("--dwi", required=True, help="4-D DWI NIfTI")
    p.add_argument("--bval", help="FSL bval file (default: DWI.bval beside it)")
    p.add_argument("--bvec", help="FSL bvec file (default: DWI.bvec beside it)")
    p.add_argument("--tractogram", required=True, help=".trk, .tck (on the DWI's grid) or .trx")
    p.add_argument("--mask", help="white-matter mask (default: the voxels the streamlines pass through)")
    p.add_argument("--peaks", help="peak directions (X, Y, Z, 3K) on the DWI grid for the EC compartments")
    p.add_argument(
        "--peaks-frame",
        choices=PEAKS_FRAMES,
        default="world",
        help="axes of the peaks: world = RAS (MRtrix sh2peaks, default); fsl = FSL's voxel frame (dtifit V1, "
        "bedpostX dyads)",
    )
    p.add_argument("--model", choices=COMMIT_MODELS, default="stick-zeppelin-ball", help="forward model")
    p.add_argument(
        "--radii",
        type=float,
        nargs="+",
        default=[1.0, 2.0, 4.0, 8.0],
        metavar="UM",
        help="cylinder-zeppelin-ball: axon radii in µm, one response each (default 1 2 4 8)",
    )
    p.add_argument("--small-delta", type=float, metavar="MS", help="cylinder-zeppelin-ball: pulse duration δ (ms)")
    p.add_argument("--big-delta", type=float, metavar="MS", help="cylinder-zeppelin-ball: pulse separation Δ (ms)")
    p.add_argument("--lambda", type=float, default=0.0, help="l1 weight on the streamline weights (default 0)")
    p.add_argument("--max-iter", type=int, default=1000, help="FISTA iterations at most (default 1000)")
    p.add_argument("--tol", type=float, default=1e-3, help="stop when the objective changes less (default 1e-3)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.set_defaults(func=cmd_commit)

    p = sub.add_parser(
        "select",
        parents=[common],
        help="keep the streamlines that pass all --include masks and no --exclude mask",
        description="A streamline passes a mask when one of its points or segments crosses one of the "
        "mask's voxels. The first --include mask is the reference grid; others on another grid are "
        "resampled to it (nearest neighbour), with a notice.",
    )
    p.add_argument("tractogram", help=".trk, .tck or .trx")
    p.add_argument("--include", action="append", metavar="MASK", help="region to pass (repeat: all of them)")
    p.add_argument("--exclude", action="append", metavar="MASK", help="region to avoid (repeat: none of them)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("-o", "--output", required=True, help="output tractogram (.trk, .tck or .trx)")
    p.set_defaults(func=cmd_select)

    p = sub.add_parser(
        "connectome",
        parents=[common],
        help="connectivity matrix of a tractogram over a parcellation (count, mean length, CM or COMMIT weight)",
        description="Each streamline end takes the label of the nearest labelled voxel (centre distance) within "
        "--radius mm (MRtrix's radial search); streamlines with both ends assigned fill the symmetric matrix. "
        "The CSV has a header row of region names (from --lut, else label_N) and the name first in every row: "
        "pandas.read_csv(PATH, index_col=0).",
    )
    p.add_argument("tractogram", help=".trk, .tck or .trx")
    p.add_argument("--labels", required=True, help="label volume (parcellation) NIfTI; 0 = no region")
    p.add_argument("--lut", help="lookup table with the region names (FreeSurfer/MRtrix LUT or BIDS dseg.tsv)")
    p.add_argument("--weight", choices=tuple(WEIGHTS), default="count",
                   help="cell value: count (default), mean length in mm, mean cm, mean commit weight")  # fmt: skip
    p.add_argument("--streamline-weights", metavar="FILE",
                   help="--weight commit: COMMIT's streamline_weights.txt (default: the commit_weight scalar)")  # fmt: skip
    p.add_argument("--radius", type=float, default=DEFAULT_RADIUS_MM, metavar="MM",
                   help=f"endpoint search radius in mm (default {DEFAULT_RADIUS_MM:g})")  # fmt: skip
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("-o", "--output", required=True, help="matrix CSV")
    p.set_defaults(func=cmd_connectome)

    p = sub.add_parser(
        "profile",
        parents=[common],
        help="along-tract profile of a scalar map (FA, MD, ...) over a bundle: mean and sd at K points",
        description="Streamlines are resampled to --points points equally spaced along their length (mm), "
        "flipped to run the same way as the bundle's mean course, and the map is sampled trilinearly. The CSV "
        "has point, position (0..1), mean, sd, n and the mean course in RAS mm.",
    )
    p.add_argument("tractogram", help="the bundle: .trk, .tck or .trx")
    p.add_argument("--map", required=True, help="3-D scalar NIfTI (e.g. FA.nii.gz)")
    p.add_argument("--points", type=int, default=100, help="points along the bundle (default 100)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("-o", "--output", required=True, help="profile CSV")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser(
        "distance",
        parents=[common],
        help="presurgical: each streamline's closest approach (mm) to a lesion mask, and those within a margin",
        description="Distance from each point to the nearest lesion voxel (each voxel taken as the ellipsoid "
        "inscribed in it; 0 inside), each segment sampled every quarter voxel. -o writes the tractogram with "
        "the per-point scalar lesion_dist_mm and the per-streamline min_lesion_dist_mm (.trk/.trx).",
    )
    p.add_argument("tractogram", help=".trk, .tck or .trx")
    p.add_argument("--lesion", required=True, help="lesion (or any region) mask NIfTI")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN_MM, metavar="MM",
                   help=f"safety margin in mm (default {DEFAULT_MARGIN_MM:g})")  # fmt: skip
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("-o", "--output", help="tractogram with the distances as scalars (.trk or .trx)")
    p.set_defaults(func=cmd_distance)

    track = sub.add_parser(
        "track", help="tractography: deterministic tensor tracking, geodesic ray tracing, probabilistic (probtrackx)"
    )
    methods = track.add_subparsers(dest="method", metavar="METHOD", required=True)
    p = methods.add_parser(
        "deterministic",
        parents=[common],
        help="follow the main eigenvector of the tensor field from seeds",
        description="Deterministic tensor tracking: trilinear tensor interpolation, main eigenvector with "
        "sign continuity, Euler or RK4 steps in mm; stops on FA, angle, mask, stop regions and max length. "
        "Seeds are random (or on a grid) within each seed voxel, reproducible with --seed-rng.",
    )
    _tensor_source_options(p)
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
    p.add_argument("--seeds-per-voxel", type=int, default=1, metavar="K", help="seeds per seed voxel (default 1)")
    p.add_argument(
        "--seed-placement",
        choices=("random", "grid"),
        default="random",
        help="random within the voxel, or an m×m×m grid (K must be a cube) (default random)",
    )
    p.add_argument("--step", type=float, default=0.5, help="step length in mm (default 0.5)")
    p.add_argument("--fa-threshold", type=float, default=0.15, help="stop where FA falls below (default 0.15)")
    p.add_argument("--max-angle", type=float, default=45.0, help="max turn per step in degrees (default 45)")
    p.add_argument("--min-length", type=float, default=20.0, help="drop streamlines shorter, mm (default 20)")
    p.add_argument("--max-length", type=float, default=250.0, help="stop streamlines at this length, mm (default 250)")
    p.add_argument(
        "--discard-truncated",
        action="store_true",
        help="drop streamlines that reached --max-length instead of keeping them",
    )
    p.add_argument("--integrator", choices=("euler", "rk4"), default="euler", help="(default euler)")
    p.add_argument(
        "--method",
        dest="direction",
        choices=("eigenvector", "tensorline"),
        default="eigenvector",
        help="follow e1, or deflect by the tensor (Weinstein tensorlines) (default eigenvector)",
    )
    p.add_argument("--puncture", type=float, default=0.2, help="tensorline puncture weight w in [0, 1] (default 0.2)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument("--seed-rng", type=int, default=0, metavar="N", help="random seed for seed placement (default 0)")
    p.add_argument("-o", "--output", required=True, help="output tractogram (.trk, .tck or .trx)")
    p.set_defaults(func=cmd_track_deterministic)

    p = methods.add_parser(
        "geodesic",
        parents=[common],
        help="geodesic ray tracing in the inverse-tensor metric, with the connectivity measure (CM)",
        description="Shoots fibres in many directions from every seed point along geodesics of the metric "
        "G = D^-1 (pre-processed: gain, positive-definite repair, optional sharpening). With --target only "
        "fibres reaching it are kept, ranked by CM where they enter it; CM is stored per point and per "
        "streamline. --step is in voxels (of the smallest voxel size); stopping rules given as 0 are off.",
    )
    _tensor_source_options(p)
    p.add_argument("--seed", metavar="MASK", required=True, help="seed region (NIfTI mask)")
    p.add_argument("--target", metavar="MASK", help="target region: keep only fibres reaching it, ranked by CM")
    p.add_argument("--mask", help="tracking mask: fibres stop on leaving it")
    p.add_argument("--seeds-per-voxel", type=int, default=1, metavar="K", help="seed points per voxel (default 1)")
    p.add_argument(
        "--seed-placement", choices=("random", "grid"), default="random", help="within each voxel (default random)"
    )
    p.add_argument("--directions", type=int, default=100, metavar="N", help="fibres per seed point (default 100)")
    p.add_argument(
        "--cone", type=float, metavar="DEG", help="directions within this half-angle around ±e1 (default: whole sphere)"
    )
    p.add_argument("--step", type=float, default=0.1, help="step in voxels (default 0.1)")
    p.add_argument("--integrator", choices=("euler", "rk2", "rk4"), default="rk2", help="(default rk2)")
    p.add_argument("--max-steps", type=int, default=2000, metavar="N", help="(default 2000)")
    p.add_argument("--max-length", type=float, default=0.0, metavar="MM", help="Euclidean length limit (0 = off)")
    p.add_argument("--max-angle", type=float, default=0.0, metavar="DEG", help="max turn per step (0 = off)")
    p.add_argument("--fa-threshold", type=float, default=0.0, metavar="T", help="stop below this FA (0 = off)")
    p.add_argument("--gain", type=float, default=0.0, help="tensor scale before inversion (0 = 1/mean MD)")
    p.add_argument("--sharpen-power", type=int, default=1, metavar="P", help="integer tensor power (1 = off)")
    p.add_argument("--sharpen-fa", type=float, default=0.0, metavar="T", help="sharpen tensors with FA below T")
    p.add_argument("--no-normalize", action="store_true", help="do not rescale the velocity to unit length")
    p.add_argument("--keep-every", type=int, default=5, metavar="N", help="store every N-th point (default 5)")
    p.add_argument("--top-percent", type=float, default=100.0, metavar="P", help="keep the P %% best by CM")
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument("--seed-rng", type=int, default=0, metavar="N", help="random seed for seed placement (default 0)")
    p.add_argument("-o", "--output", required=True, help="output tractogram (.trk, .tck or .trx)")
    p.set_defaults(func=cmd_track_geodesic)

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
    p.add_argument("--samples", required=True, metavar="BEDPOSTX_DIR", help="bedpostX folder (ours or FSL's)")
    p.add_argument("--seed", required=True, metavar="MASK", help="seed mask: --nsamples streamlines per voxel")
    p.add_argument("--target", action="extend", nargs="+", metavar="MASK", help="target masks (seeds_to_{target})")
    p.add_argument("--waypoints", action="extend", nargs="+", metavar="MASK", help="waypoint masks to pass")
    p.add_argument("--waycond", choices=("AND", "OR"), default="AND", help="pass all waypoints or any (default AND)")
    p.add_argument("--exclude", metavar="MASK", help="exclusion mask: streamlines entering it are discarded")
    p.add_argument("--stop", metavar="MASK", help="stop mask: streamlines end on entering it")
    p.add_argument("--nsamples", type=int, default=5000, help="streamlines per seed voxel (default 5000)")
    p.add_argument("--steplength", type=float, default=0.5, help="step length in mm (default 0.5)")
    p.add_argument("--nsteps", type=int, default=2000, help="max steps per half streamline (default 2000)")
    p.add_argument("--cthr", type=float, default=0.2, help="curvature threshold, a cosine (default 0.2)")
    p.add_argument("--fibthresh", type=float, default=0.01, help="sticks with a smaller fraction are not followed")
    p.add_argument("--randfib", type=int, choices=(0, 1, 2), default=0, help="first step's stick (default 0)")
    p.add_argument("--loopcheck", action="store_true", help="stop a half that re-enters a voxel it left")
    p.add_argument("--modeuler", action="store_true", help="modified Euler integration")
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument("--seed-rng", type=int, default=0, metavar="N", help="random seed (default 0)")
    p.add_argument(
        "--seed-matrix",
        "--omatrix1",
        action="store_true",
        help="also count the seed x seed matrix (probtrackx's matrix1): matrix_seeds_to_seeds.npy/.csv",
    )
    p.add_argument(
        "--save-paths",
        metavar="F",
        help="also save the kept streamlines as a tractogram (.trx, .trk or .tck), "
        "traced again with the run's random numbers; at most --save-paths-max of them (the first samples of "
        "every seed voxel alike)",
    )
    p.add_argument(
        "--save-paths-max", type=int, default=10_000, metavar="N", help="streamlines traced for --save-paths"
    )
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.set_defaults(func=cmd_track_probabilistic)
    return parser


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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # the GUI launcher handles the no-command case
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="tractlens: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.func(args)
    except (InputError, BackendError) as exc:
        if args.debug:
            raise
        print(f"tractlens {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except OutOfDeviceMemory as exc:
        if args.debug:
            raise
        print(f"tractlens {args.command}: error: {exc}. Try --device cpu or a smaller mask.", file=sys.stderr)
        return EXIT_INPUT
    except (KeyboardInterrupt, Cancelled):
        print(f"tractlens {args.command}: interrupted; nothing half-written was left behind.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"tractlens {args.command}: internal error: {type(exc).__name__}: {exc}. "
            "Run again with --debug for the traceback and report it.",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
