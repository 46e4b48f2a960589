"""``tractlens fit-dti`` and ``tractlens fit-ballstick``: model fits of a DWI series, written as maps."""

from __future__ import annotations

from pathlib import Path

from tractlens.gpu.backend import DEVICES, check_device
from tractlens.gpu.ballstick import BallStickParams
from tractlens.gpu.dti import DTIFitParams

from ..io.outputs import check_output_folder
from ..timing import phase
from ._common import EXIT_OK, Progress, emit, log, warm_up_gpu_in_background
from .options import add_params, params_from_args


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "fit-dti",
        parents=[common],
        help="fit diffusion tensors; write dtifit-named maps (dti_FA, dti_MD, dti_MO, dti_V1-V3, dti_L1-L3, ...)",
        description="Fit diffusion tensors (WLS by default) and write the maps as NIfTI, named as FSL's dtifit "
        "names them (PREFIX_FA.nii.gz, PREFIX_V1.nii.gz, PREFIX_tensor.nii.gz, ...), so fslpy and FSLeyes "
        "recognise the folder; AD, RD, RGB, mask and flags are written under the same prefix. "
        "Without --mask, a brain mask is computed from the mean b=0 image "
        "(3x3x3 median filter twice, Otsu threshold, largest connected component, holes filled).",
    )
    _dwi_options(p)
    add_params(p, DTIFitParams)
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument(
        "--prefix", default="dti", help="file-name prefix of the maps, as dtifit's --out basename (default: dti)"
    )
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
    _dwi_options(p)
    add_params(p, BallStickParams)
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument("-o", "--output", required=True, help="output folder (the bedpostX folder)")
    p.set_defaults(func=cmd_fit_ballstick)


def _dwi_options(p) -> None:
    p.add_argument("dwi", help="4-D diffusion-weighted NIfTI (.nii or .nii.gz)")
    p.add_argument("--bval", help="FSL bval file (default: NAME.bval beside the image)")
    p.add_argument("--bvec", help="FSL bvec file (default: NAME.bvec beside the image)")
    p.add_argument("--mask", help="brain mask NIfTI on the same grid (default: computed from b=0)")


def _run_fit(args, params_type, fix: str, pipeline, write, describe, written: str) -> int:
    """The body every fit command shares: check the device and the output folder before any
    work, load the DWI, fit with progress on stderr, pass the warnings on, write, summarise.
    ``describe(params, fit_provenance)`` names the model in the one-line summary, ``written``
    what the output folder holds."""
    from ..io import load_dwi

    check_device(args.device)  # fail early and clearly when --device gpu has no GPU
    params = params_from_args(params_type, args, fix=fix)
    check_output_folder(args.output)  # before the fit, not after it
    warm_up_gpu_in_background(args, args.command)
    with phase("read"):
        dwi = load_dwi(args.dwi, args.bval, args.bvec, b0_threshold=params.b0_threshold)
    for warning in dwi.warnings:
        log.warning("%s", warning)
    with phase("compute"):
        result = pipeline(
            dwi,
            mask_path=args.mask,
            params=params,
            device=args.device,
            progress=Progress(args.command, "voxels", quiet=args.quiet),
        )
    for warning in result.warnings[len(dwi.warnings) :]:
        log.warning("%s", warning)
    with phase("write"):
        files = write(result, args.output)
    summary = {
        "outdir": str(Path(args.output)),
        "files": sorted(Path(f).name for f in files.values()),
        **result.summary(),
    }
    fit = result.fit.provenance
    human = (
        f"fitted {summary['voxels_fitted']} voxels ({describe(params, fit)}) on "
        f"{fit['backend']} ({fit['device']}) in {fit['total_s']:.2f} s; {written} written to {args.output}"
    )
    emit(args, summary, human)
    return EXIT_OK


def cmd_fit_dti(args) -> int:
    from ..pipelines.dti import check_prefix, fit_dti_pipeline, write_dti_outputs

    check_prefix(args.prefix, args.output)  # before the fit, not after it
    return _run_fit(
        args,
        DTIFitParams,
        "Check the fit options (see tractlens fit-dti --help)",
        fit_dti_pipeline,
        lambda result, outdir: write_dti_outputs(result, outdir, prefix=args.prefix),
        lambda params, fit: f"{fit['method'].upper()}, {fit['precision']}",
        "maps",
    )


def cmd_fit_ballstick(args) -> int:
    from ..pipelines.ballstick import fit_ballstick_pipeline, write_ballstick_outputs

    return _run_fit(
        args,
        BallStickParams,
        "Check the MCMC options (see tractlens fit-ballstick --help)",
        fit_ballstick_pipeline,
        write_ballstick_outputs,
        lambda params, fit: f"{params.n_fibres} sticks, {params.n_samples} samples",
        "bedpostX folder",
    )
