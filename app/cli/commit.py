"""``tractlens commit``: COMMIT filtering, a weight per streamline from the DWI signal."""

from __future__ import annotations

from pathlib import Path

from tractlens.gpu.backend import DEVICES, check_device
from tractlens.gpu.commit import CommitParams

from ..io.outputs import check_output_folder
from ..pipelines.commit import PEAKS_FRAMES, write_commit_outputs
from ..timing import phase
from ._common import EXIT_OK, Progress, emit, log, warm_up_gpu_in_background
from .options import add_params, params_from_args


def add_parsers(sub, common) -> None:
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
    add_params(p, CommitParams)
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="N",
        help="split the operator by voxel rows over the first N GPUs of this host (a tractogram larger than one "
        "GPU's memory; weights equal to one GPU's within float32). A GPU that fails is named and nothing is written",
    )
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.set_defaults(func=cmd_commit)


def cmd_commit(args) -> int:
    from ..usecases.commit import commit_from_files  # imported when the command runs, not at every start

    check_device(args.device)
    params = params_from_args(CommitParams, args, fix="Check the COMMIT options (see tractlens commit --help)")
    out = check_output_folder(args.output)
    warm_up_gpu_in_background(args, "commit")
    with phase("compute"):  # reading the inputs is its own phase inside
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
            gpus=args.gpus,
            progress=Progress("commit", "iterations", quiet=args.quiet),
        )
    for note in result.notes:
        log.warning("%s", note)
    with phase("write"):
        files = write_commit_outputs(result, out, suffix)
    summary = {"outdir": str(out), "files": sorted(Path(f).name for f in files.values()), **result.summary()}
    human = (
        f"{summary['kept']} of {summary['streamlines']} streamlines kept (weight > 0), "
        f"{summary['iterations']} FISTA iterations ({summary['stopped']}) on {result.provenance['backend']} "
        f"({result.provenance['device']}) in {result.provenance['fit_s']:.2f} s; written to {out}"
    )
    emit(args, summary, human)
    return EXIT_OK
