"""``tractlens import-dicom`` and ``tractlens export-dicom``: the clinical round trip.

``import-dicom DICOM_DIR -o OUTDIR`` lists the series of a CD or PACS export and converts them
(dcm2niix) into BIDS-named NIfTI with ``.bval``/``.bvec``/JSON sidecars; ``--series`` picks
the diffusion series when there are several. ``export-dicom TRACTOGRAM... --reference
SERIES_DIR -o OUTDIR`` writes the bundles (and ``--lesion``) as SEG, RTSTRUCT and a derived
coloured series on the reference series (:mod:`app.io.dicom_export`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..anatomy import load_registration, mask_onto, points_onto, side_of_grid
from ..errors import InputError
from ..grid import Grid
from ..params import DicomExportParams, DicomImportParams
from ._common import EXIT_OK, Progress, emit
from .options import add_params, params_from_args

log = logging.getLogger("tractlens")


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "import-dicom",
        parents=[common],
        help="convert a DICOM folder (CD, PACS export) into BIDS-named NIfTI with gradient files",
        description="Lists the series found (number, description, kind, slices) and converts them with "
        "dcm2niix: the diffusion series to sub-LABEL/dwi/sub-LABEL_dwi.nii.gz with .bval/.bvec/.json, the "
        "others to sub-LABEL/anat/. LABEL is the patient ID in letters and digits (--subject overrides "
        "it; 01 when there is none or with --deidentify). Every command also accepts a DICOM folder "
        "where it takes a NIfTI.",
    )
    p.add_argument("dicom_dir", metavar="DICOM_DIR", help="folder of DICOM files (searched recursively)")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="folder to write into")
    p.add_argument(
        "--series",
        metavar="SERIES",
        help="the series to convert (its number, description or UID): needed when several diffusion series",
    )
    add_params(p, DicomImportParams)
    p.add_argument("--list", action="store_true", help="only list the series, convert nothing")
    p.set_defaults(func=cmd_import_dicom)

    p = sub.add_parser(
        "export-dicom",
        parents=[common],
        help="bundles (and a lesion) as DICOM SEG, RTSTRUCT and a coloured series for navigation and PACS",
        description="Each bundle's volume is the reference voxels its streamlines pass through (--dilate "
        "grows it). The objects refer to the reference's study, series and frame of reference.",
    )
    p.add_argument("tractograms", nargs="*", metavar="TRACTOGRAM", help=".trk, .tck or .trx, one per bundle")
    p.add_argument(
        "--envelopes",
        metavar="DIR",
        action="append",
        help="a folder of tractlens envelopes: each level becomes a SEG segment and an RTSTRUCT ROI named "
        "with its level (repeat for several bundles)",
    )
    p.add_argument("--lesion", metavar="MASK", help="lesion mask (NIfTI or DICOM folder), exported beside the bundles")
    p.add_argument("--reference", required=True, metavar="DICOM_SERIES_DIR", help="the series to export onto")
    p.add_argument(
        "--dwi",
        metavar="DWI",
        help="the diffusion data the bundles come from (DICOM folder, or NIfTI imported by import-dicom): "
        "checks that the reference shares its frame of reference",
    )
    p.add_argument(
        "--registration",
        action="append",
        metavar="DIR",
        help="a registration between the diffusion data and the reference series (tractlens register): places "
        "the bundles and the lesion on a reference of another frame of reference; repeat it to chain "
        "registrations that meet at one image",
    )
    add_params(p, DicomExportParams)
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="folder to write into")
    p.set_defaults(func=cmd_export_dicom)


def cmd_import_dicom(args) -> int:
    from ..io.dicom_import import import_dicom
    from ..io.dicom_series import list_series
    from ..io.outputs import check_output_folder

    listed = list_series(args.dicom_dir)
    found = "\n".join(f"  {s.label}" for s in listed)
    if args.list:
        emit(args, {"series": [s.as_dict() for s in listed]}, f"{len(listed)} series in {args.dicom_dir}:\n{found}")
        return EXIT_OK
    check_output_folder(args.output)
    progress = Progress("import-dicom", "series", args.quiet)
    options = params_from_args(DicomImportParams, args)
    converted = import_dicom(args.dicom_dir, args.output, series=args.series, subject=options.subject or None,
                             deidentify=options.deidentify, progress=progress)  # fmt: skip
    lines = [f"{len(listed)} series in {args.dicom_dir}:", found, f"converted into {args.output}:"]
    lines += [f"  {c.series.label} -> {c.nifti}" for c in converted]
    summary = {"found": [s.as_dict() for s in listed], "converted": [c.as_dict() for c in converted]}
    emit(args, summary, "\n".join(lines))
    return EXIT_OK


def dwi_frame_of_reference(path: str | None) -> str | None:
    """The frame-of-reference UID of the diffusion data: from a DICOM folder's diffusion series,
    or from the JSON sidecar import-dicom wrote beside a NIfTI; None when it cannot be told."""
    if not path:
        return None
    from ..io.dicom_series import choose, is_dicom_folder, list_series
    from ..report_data import sidecar_path

    if is_dicom_folder(path):
        listed = list_series(path)
        return choose(listed, None, Path(path), kind="dwi" if len(listed) > 1 else None).frame_uid
    import json

    sidecar = sidecar_path(path)
    if sidecar is None:
        return None
    try:
        return json.loads(sidecar.read_text(encoding="utf-8")).get("FrameOfReferenceUID") or None
    except (OSError, ValueError):
        return None


def envelope_structures(folders) -> list[tuple[str, object, object]]:
    """(name with level, mask, affine) of every level of every envelopes folder."""
    from ..pipelines.envelope_files import read_envelopes

    out = []
    for folder in folders:
        found = read_envelopes(folder)
        bundle = Path(folder).name or "tract"
        out += [(f"{bundle} envelope {e.label}", e.mask, found.affine) for e in found.envelopes]
    return out


def cmd_export_dicom(args) -> int:
    from ..io import load_mask, load_tractogram
    from ..io.dicom_export import check_frame_of_reference, export_dicom, read_reference, structures_on_reference
    from ..io.nifti import load_image
    from ..io.outputs import check_output_folder
    from ._common import require_streamlines

    params = params_from_args(DicomExportParams, args)
    check_output_folder(args.output)
    reference = read_reference(args.reference)
    registration = target_side = None
    if args.registration:  # the registration bridges the two frames of reference
        registration = load_registration(args.registration)
        target_side = side_of_grid(registration, Grid(reference.affine, reference.shape), "reference series")
    else:
        check_frame_of_reference(reference, dwi_frame_of_reference(args.dwi), args.dwi or "")
    bundles, without = [], []
    for path in args.tractograms:
        tract = load_tractogram(path, reference=(reference.affine, reference.shape) if registration is None else None)
        if len(tract) == 0:  # a bundle nothing reached (bundles writes it): left out, as one outside the series
            without.append(path)
            continue
        points_mm = tract.points @ tract.affine[:3, :3].T + tract.affine[:3, 3]
        if registration is not None:
            points_mm = points_onto(registration, target_side)(points_mm)
        bundles.append((Path(path).name.split(".")[0], points_mm, tract.offsets, tract.point_scalars.get("fa")))
    if not args.tractograms and not args.envelopes:
        raise InputError("nothing to export", fix="Give one or more tractograms, or --envelopes DIR")
    if without and not bundles and not args.envelopes and not args.lesion:
        require_streamlines([], without[0], "the export")
    for path in without:
        log.warning("%s holds no streamlines and is left out of the export", Path(path).name)

    def onto_reference(mask, affine):
        """A mask of the diffusion side through the registration; one on the reference's side as it is."""
        mask_grid = Grid(affine, np.asarray(mask).shape)
        if registration is None or mask_grid.same_placement(getattr(registration, target_side)):
            return mask, affine
        grid = Grid(reference.affine, reference.shape)
        return mask_onto(registration, mask, mask_grid, grid, target_side), reference.affine

    envelopes = [
        (name, *onto_reference(mask, affine)) for name, mask, affine in envelope_structures(args.envelopes or ())
    ]
    lesion = None
    if args.lesion:
        lesion = (Path(args.lesion).name.split(".")[0] or "lesion", load_mask(args.lesion, what="lesion mask"),
                  load_image(args.lesion).affine)  # fmt: skip
        lesion_grid = Grid(lesion[2], np.asarray(lesion[1]).shape)
        if registration is not None and not lesion_grid.same_placement(getattr(registration, target_side)):
            # a lesion drawn on the diffusion side goes through the registration; one drawn on the
            # reference series' own grid is already in place
            grid = Grid(reference.affine, reference.shape)
            moved = mask_onto(registration, lesion[1], lesion_grid, grid, target_side)
            lesion = (lesion[0], moved, reference.affine)
    structures = structures_on_reference(reference, bundles, lesion, params.dilate_mm, envelopes)
    result = export_dicom(reference, structures, args.output, params, Progress("export-dicom", "objects", args.quiet))
    summary = result.as_dict()
    lines = [f"exported onto {reference.first.get('SeriesDescription', '')} ({args.reference}):"]
    if registration is not None:
        summary["registration"] = registration.describe()
        lines.append(f"  placed through the registration {registration.describe()}")
    lines += [f"  {kind}: {len(paths)} file(s) in {paths[0].parent}" for kind, paths in result.files.items()]
    lines += [f"  {s['name']}: {s['voxels']} voxels" for s in result.structures]
    emit(args, summary, "\n".join(lines))
    return EXIT_OK
