"""``tractlens register``, ``apply-transform`` and ``atlas``: the patient's anatomy and the MNI template
in the same space as the tracts (:mod:`app.anatomy`). The use cases are imported when a command runs,
not when the parser is built: every ``tractlens`` command builds every parser, and these commands'
imports (SciPy's ndimage, DIPY, nitransforms) would otherwise be paid by all of them."""

from __future__ import annotations

from ..errors import InputError
from ..params import RegisterParams
from ._common import EXIT_OK, Progress, emit
from .options import add_params, params_from_args

DEVICES = ("auto", "cpu", "gpu")
RESAMPLE_DEVICE_HELP = (
    "where images are resampled: cpu (every core: NumPy, or for large 4-D images numba's compiled loop of the "
    "cpu extra), gpu (CuPy), auto (the CPU in a fresh command, faster than starting the GPU for one image; the "
    "GPU where CuPy already runs) (default auto)"
)


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "register",
        parents=[common],
        help="register two images (T1/FLAIR/fMRI ↔ DWI, subject ↔ MNI): ITK/ANTs transforms",
        description="Register MOVING onto FIXED: centres of mass, rigid, affine (mutual information) and for "
        "--type syn a symmetric diffeomorphic warp. DIR receives 0GenericAffine.mat (and 1Warp.nii.gz, "
        "1InverseWarp.nii.gz), which ANTs and nitransforms read, moving_in_fixed.nii.gz and registration.json. "
        "MOVING and FIXED: NIfTI, MGZ or a DICOM folder; a 4-D diffusion series is registered through its mean "
        "b=0 (--volume N for one volume); FIXED may be the word 'mni' (the MNI152 template).",
    )
    p.add_argument("moving", help="the image to bring onto FIXED")
    p.add_argument("fixed", help="the image it is brought onto, or 'mni'")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="registration folder")
    add_params(p, RegisterParams)
    p.add_argument("--volume", type=int, metavar="N", help="the volume of a 4-D MOVING image to register (0 = first)")
    p.add_argument(
        "--fixed-volume", type=int, metavar="N", help="the volume of a 4-D FIXED image to register (0 = first)"
    )
    p.add_argument("--moving-mask", metavar="NIFTI", help="only this part of MOVING drives the registration")
    p.add_argument("--fixed-mask", metavar="NIFTI", help="only this part of FIXED drives the registration")
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="registration runs on the CPU (DIPY) whatever is chosen: with gpu it still does, and the summary "
        "says so (default auto)",
    )
    p.set_defaults(func=cmd_register)

    a = sub.add_parser(
        "apply-transform",
        parents=[common],
        help="bring an image, labels or a tractogram through a registration onto a reference grid",
        description="Images are resampled (linear), label and ROI images take the nearest label (--interp auto "
        "tells them apart), tractograms' points are mapped through the inverse transform with their scalars kept. "
        "Forward: from the registration's moving space to its fixed space; --inverse: the other way. Other tools' "
        "transforms: --transform FILE (repeatable, in antsApplyTransforms order: a displacement field, then an "
        "affine): ITK/ANTs .mat and 5-D warps, FSL FLIRT .mat (with --flirt-ref and --flirt-in) and FNIRT fields.",
    )
    a.add_argument("input", help="NIfTI/MGZ image, label or ROI image, or .trk/.tck/.trx")
    source = a.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--registration",
        action="append",
        metavar="DIR",
        help="a folder of tractlens register; repeat it to chain registrations that meet at one image, in the "
        "order the data goes (an MNI atlas to the DWI: --registration t1_to_mni --registration t1_to_dwi)",
    )
    source.add_argument("--transform", action="append", metavar="FILE", help="another tool's transform file")
    a.add_argument(
        "--inverse-warp",
        metavar="NIFTI",
        help="the inverse of --transform's displacement field (ITK), to map tractograms",
    )
    a.add_argument("--flirt-ref", metavar="NIFTI", help="FLIRT's -ref image, for a FLIRT .mat")
    a.add_argument("--flirt-in", metavar="NIFTI", help="FLIRT's -in image, for a FLIRT .mat")
    a.add_argument("--reference", required=True, metavar="IMAGE", help="the grid of the output (and its space)")
    a.add_argument("-o", "--output", required=True, help="output image or tractogram")
    a.add_argument("--inverse", action="store_true", help="from the fixed space to the moving space")
    a.add_argument(
        "--interp",
        choices=("auto", "linear", "nearest"),
        default="auto",
        help="interpolation of images: auto takes nearest for label and ROI images (default auto)",
    )
    a.add_argument("--device", choices=DEVICES, default="auto", help=RESAMPLE_DEVICE_HELP)
    a.set_defaults(func=cmd_apply_transform)

    t = sub.add_parser(
        "atlas",
        parents=[common],
        help="an MNI atlas on the subject's grid (labels + lookup table); 'atlas list' lists them",
        description="'tractlens atlas list' lists the atlases with their licence and citation. 'tractlens atlas "
        "NAME --registration DIR --reference IMAGE -o labels.nii.gz' draws the atlas on IMAGE's grid through a "
        "registration to the MNI template (tractlens register IMAGE mni -o DIR) and writes labels.tsv beside "
        "the output; both serve as connectome --labels and as ROIs.",
    )
    t.add_argument("name", help="an atlas name, or 'list'")
    t.add_argument(
        "--registration",
        action="append",
        metavar="DIR",
        help="a registration of the subject to or from 'mni'; repeat it to reach the reference's image through "
        "another (--registration t1_to_mni --registration t1_to_dwi: the atlas on the DWI through the T1)",
    )
    t.add_argument("--reference", metavar="IMAGE", help="the subject's image whose grid the labels take")
    t.add_argument("-o", "--output", help="labels NIfTI (the lookup table is written beside it as .tsv)")
    t.add_argument("--device", choices=DEVICES, default="auto", help=RESAMPLE_DEVICE_HELP)
    t.set_defaults(func=cmd_atlas)


def cmd_register(args) -> int:
    from ..anatomy import register_images

    params = params_from_args(RegisterParams, args)
    progress = Progress("register", "stages", args.quiet)
    result = register_images(
        args.moving,
        args.fixed,
        args.output,
        params,
        volume=args.volume,
        fixed_volume=args.fixed_volume,
        moving_mask=args.moving_mask,
        fixed_mask=args.fixed_mask,
        progress=progress,
        device=args.device,
    )
    summary = {"output": args.output, **result.summary}
    notes = [
        f"{side}: {info['used']}"
        for side, info in (("moving", summary["moving_image"]), ("fixed", summary["fixed_image"]))
        if info["used"] != "the image"
    ]
    if args.device == "gpu":
        notes.append(summary["engine"])  # asked for the GPU: say where it ran
    human = (
        f"{result.registration.describe()}; mutual information {summary['mutual_information_before']:.3f} → "
        f"{summary['mutual_information_after']:.3f}; {summary['seconds']['total']:.1f} s"
        + (f" ({'; '.join(notes)})" if notes else "")
    )
    emit(args, summary, human)
    return EXIT_OK


def cmd_apply_transform(args) -> int:
    from ..anatomy import apply_transform
    from ..io.nifti import image_grid, load_image
    from ..io.transforms import load_user_transforms

    if args.registration:
        registration = args.registration
    else:
        ref = load_image(args.reference, "reference image")
        registration = load_user_transforms(
            args.transform,
            image_grid(ref, args.reference, "reference image"),
            inverse_warp=args.inverse_warp,
            flirt_ref=args.flirt_ref,
            flirt_in=args.flirt_in,
        )
    summary = apply_transform(
        args.input,
        registration,
        args.reference,
        args.output,
        inverse=args.inverse,
        interp=args.interp,
        device=args.device,
    )
    emit(args, summary, f"{summary['kind']} {summary['direction']} written to {summary['output']}")
    return EXIT_OK


def cmd_atlas(args) -> int:
    from ..anatomy import write_atlas
    from ..atlases import TEMPLATES, atlas_info, atlas_names

    if args.name == "list":
        rows = [
            {"name": name, **{k: v for k, v in vars(atlas_info(name)).items() if k in ("title", "licence", "citation")}}
            for name in atlas_names()
        ]
        templates = [{"name": name, "title": title, "citation": cite} for name, (_, title, cite) in TEMPLATES.items()]
        human = "\n".join(f"{row['name']:28s} {row['title']}\n{'':28s} licence: {row['licence']}" for row in rows)
        emit(args, {"atlases": rows, "templates": templates}, human)
        return EXIT_OK
    missing = [
        flag
        for flag, value in (("--registration", args.registration), ("--reference", args.reference), ("-o", args.output))
        if not value
    ]
    if missing:
        raise InputError(
            f"tractlens atlas {args.name} needs {', '.join(missing)}",
            fix="e.g. tractlens atlas aal --registration reg --reference fa.nii.gz -o aal.nii.gz",
        )
    summary = write_atlas(args.name, args.registration, args.reference, args.output, device=args.device)
    emit(
        args,
        summary,
        f"{summary['atlas']}: {summary['structures_on_grid']} of {summary['structures']} structures on "
        f"the grid, written to {summary['output']} and {summary['lookup_table']}",
    )
    return EXIT_OK
