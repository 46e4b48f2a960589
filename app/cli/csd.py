"""``tractlens fit-csd``: fibre orientation distributions by constrained spherical deconvolution."""

from __future__ import annotations

from pathlib import Path

from tractlens.gpu.backend import DEVICES, check_device
from tractlens.gpu.csd import CSDParams
from tractlens.gpu.csd_peaks import PeakParams

from ..io.outputs import check_output_folder
from ..timing import phase
from ._common import EXIT_OK, Progress, emit, log
from .options import add_params, params_from_args


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "fit-csd",
        parents=[common],
        help="fit fODFs by constrained spherical deconvolution; write fod, peaks, response (MRtrix formats)",
        description="Single-shell CSD (Tournier 2007) on the highest shell, or with --msmt multi-shell "
        "multi-tissue CSD (Jeurissen 2014: WM fODF, GM and CSF). Responses are estimated from the data "
        "(single-fibre voxels by FA; GM and CSF by FA and MD) unless --response gives the WM one. Writes "
        "fod.nii.gz (SH coefficients in MRtrix's basis and world frame, for mrview/tckgen), peaks.nii.gz "
        "(as sh2peaks), response.txt, gm/csf.nii.gz with --msmt, mask, flags and fit_csd.json. "
        "Without --mask, a brain mask is computed from the mean b=0 image.",
    )
    p.add_argument("dwi", help="4-D diffusion-weighted NIfTI (.nii or .nii.gz)")
    p.add_argument("--bval", help="FSL bval file (default: NAME.bval beside the image)")
    p.add_argument("--bvec", help="FSL bvec file (default: NAME.bvec beside the image)")
    p.add_argument("--mask", help="brain mask NIfTI on the same grid (default: computed from b=0)")
    add_params(p, CSDParams)
    p.add_argument("--response", help="WM response file (MRtrix format, one row per shell; default: from the data)")
    add_params(p, PeakParams)
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.set_defaults(func=cmd_fit_csd)


def cmd_fit_csd(args) -> int:
    from ..io import load_dwi
    from ..pipelines.csd import fit_csd_pipeline, write_csd_outputs

    check_device(args.device)
    params = params_from_args(CSDParams, args, fix="Check the CSD options (see tractlens fit-csd --help)")
    peak_params = params_from_args(PeakParams, args, fix="Check the peak options (see tractlens fit-csd --help)")
    check_output_folder(args.output)
    with phase("read"):
        dwi = load_dwi(args.dwi, args.bval, args.bvec, b0_threshold=params.b0_threshold)
    for warning in dwi.warnings:
        log.warning("%s", warning)
    with phase("compute"):
        result = fit_csd_pipeline(
            dwi,
            mask_path=args.mask,
            params=params,
            peak_params=peak_params,
            response_path=args.response,
            device=args.device,
            progress=Progress(args.command, "voxels", quiet=args.quiet),
        )
    for warning in result.warnings[len(dwi.warnings) :]:
        log.warning("%s", warning)
    with phase("write"):
        files = write_csd_outputs(result, args.output)
    summary = {
        "outdir": str(Path(args.output)),
        "files": sorted(Path(f).name for f in files.values()),
        **result.summary(),
    }
    fit = result.fit.provenance
    human = (
        f"fitted {summary['voxels_fitted']} voxels ({fit['method']}, lmax {fit['lmax']}) on {fit['backend']} "
        f"({fit['device']}) in {fit['total_s']:.2f} s; fODFs and peaks written to {args.output}"
    )
    emit(args, summary, human)
    return EXIT_OK
