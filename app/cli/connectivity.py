"""``tractlens select``, ``connectome``, ``profile`` and ``distance``: what a tractogram says about
regions (selection by masks, the connectivity matrix, along-tract profiles, distance to a lesion)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tractlens.gpu.backend import DEVICES, check_device

from ..errors import InputError
from ..io.outputs import check_output_file
from ..params import ConnectomeParams, LesionDistanceParams, ProfileParams, ProfileTableParams
from ..timing import phase
from ._common import EXIT_OK, Progress, emit, log, require_streamlines
from .options import add_params, params_from_args


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "select",
        parents=[common],
        help="keep the streamlines that pass all --include masks and no --exclude mask",
        description="A streamline passes a mask when one of its points or segments crosses one of the "
        "mask's voxels. The first --include mask is the reference grid; others on another grid are "
        "resampled to it (nearest neighbour), with a notice.",
    )
    p.add_argument("tractogram", help=".trk, .tck or .trx")
    p.add_argument(
        "--include", action="append", required=True, metavar="MASK", help="region to pass (repeat: all of them)"
    )
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
    p.add_argument(
        "--labels",
        required=True,
        help="label volume (parcellation): NIfTI or FreeSurfer .mgz (aparc+aseg.mgz); 0 = no region",
    )
    p.add_argument("--lut", help="lookup table with the region names (FreeSurfer/MRtrix LUT or BIDS dseg.tsv)")
    add_params(p, ConnectomeParams, only=("weight",))
    p.add_argument("--streamline-weights", metavar="FILE",
                   help="--weight commit: COMMIT's streamline_weights.txt (default: the commit_weight scalar)")  # fmt: skip
    add_params(p, ConnectomeParams, only=("radius_mm",))
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("-o", "--output", required=True, help="matrix CSV")
    p.set_defaults(func=cmd_connectome)

    p = sub.add_parser(
        "profile",
        parents=[common],
        help="along-tract profiles of maps (FA, MD, NDI, ...) over a bundle, or over every named bundle",
        description="Streamlines are resampled to --points nodes equally spaced along their length (mm), "
        "flipped to run the same way as the bundle's mean course, each map is sampled trilinearly on its own "
        "grid at the nodes' RAS mm, and the streamlines are averaged with pyAFQ's weights (--weighting "
        "gaussian: the inverse Mahalanobis distance to the bundle's core; Yeatman et al. 2012). "
        "TRACTOGRAM --map FILE (one unnamed map) writes the single-bundle CSV: point, position (0..1), mean, "
        "sd, n and the mean course in RAS mm. --bundles OUTDIR (a tractlens bundles folder; all bundles or "
        "--names), several maps, NAME=FILE maps or --fit DIR write the tidy table instead: columns subject, "
        "session, bundle, node, metric, value (pyAFQ's; pandas.read_csv and seaborn take it as is; -o .json "
        "for JSON). A bundle without streamlines keeps its rows with empty values and is named in the summary.",
    )
    p.add_argument("tractogram", nargs="?", help="the bundle: .trk, .tck or .trx (or give --bundles)")
    p.add_argument("--bundles", metavar="OUTDIR", help="a tractlens bundles folder: profile its bundles")
    p.add_argument("--names", nargs="+", metavar="NAME", help="only these bundles of --bundles (default all)")
    p.add_argument("--map", action="append", metavar="[NAME=]FILE",
                   help="3-D scalar NIfTI (e.g. FA=dti_FA.nii.gz of fit-dti); repeat for several metrics")  # fmt: skip
    p.add_argument("--fit", metavar="DIR", help="every 3-D map of a fit-dti or fit-model folder (FA, MD, NDI, ...)")
    add_params(p, ProfileTableParams)
    add_params(p, ProfileParams)
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("-o", "--output", required=True, help="profile CSV (tidy form: .csv or .json)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser(
        "distance",
        parents=[common],
        help="presurgical: each streamline's closest approach (mm) to a lesion mask, and those within a margin",
        description="Distance from each point to the nearest lesion voxel (each voxel taken as the ellipsoid "
        "inscribed in it; 0 inside), each segment sampled every quarter voxel. -o writes the tractogram with "
        "the per-point scalar lesion_dist_mm and the per-streamline min_lesion_dist_mm (.trk/.trx).",
    )
    p.add_argument("tractogram", nargs="?", help=".trk, .tck or .trx (or give --envelopes)")
    p.add_argument("--lesion", required=True, help="lesion (or any region) mask NIfTI")
    p.add_argument(
        "--envelopes",
        metavar="DIR",
        help="instead of a tractogram: a folder of tractlens envelopes; the lesion's distance to each level",
    )
    add_params(p, LesionDistanceParams)
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("-o", "--output", help="tractogram with the distances as scalars (.trk or .trx)")
    p.set_defaults(func=cmd_distance)


def cmd_select(args) -> int:
    from ..io import load_tractogram, save_tractogram
    from ..io.tractogram import check_output_suffix
    from ..pipelines.select import select_pipeline

    check_device(args.device)
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
    empty = " (the input holds no streamlines)" if len(tract) == 0 else ""
    emit(args, summary, f"kept {len(selected)} of {len(tract)} streamlines{empty}; written to {args.output}")
    return EXIT_OK


def cmd_connectome(args) -> int:
    from ..io import load_labels, load_tractogram
    from ..io.lut import load_lut
    from ..io.nifti import load_image
    from ..io.tractogram_ends import load_tractogram_ends
    from ..model import Volume
    from ..pipelines.connectivity import compute_connectome, write_matrix_csv

    params = params_from_args(ConnectomeParams, args)
    check_device(args.device)
    check_output_file(args.output, "matrix CSV")
    with phase("read"):  # the command's phases in its summary (a cohort's steps are compared by them)
        labels_img = load_image(args.labels, "label volume")
        labels = Volume("labels", load_labels(args.labels), labels_img.affine, kind="labels", source=str(args.labels))
        lut = load_lut(args.lut) if args.lut else None
        weights = _read_weights(args.streamline_weights) if args.streamline_weights else None
        if params.weight == "length":  # the mean length needs every point
            tract = load_tractogram(args.tractogram, reference=args.labels)
        else:  # the ends are all the assignment reads: a whole brain's other points are not converted
            tract = load_tractogram_ends(args.tractogram, reference=args.labels)
    require_streamlines(tract, args.tractogram, "a connectome")
    with phase("compute"):
        result = compute_connectome(
            tract,
            labels,
            weight=params.weight,
            lut=lut,
            radius_mm=params.radius_mm,
            weights=weights,
            device=args.device,
            progress=Progress("connectome", "streamline ends", quiet=args.quiet),
        )
    with phase("write"):
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
    emit(
        args,
        summary,
        f"{result.provenance['assigned']} of {len(tract)} streamlines join two of {len(result.row_names)} regions "
        f"({summary['edges']} connections); {params.weight} matrix written to {args.output}",
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


def _tidy_form(args) -> bool:
    """Whether ``profile`` writes the tidy table (bundles folder, several or named maps, a fit
    folder) rather than the single-bundle CSV of one unnamed map."""
    maps = args.map or []
    return bool(args.bundles or args.fit or len(maps) != 1 or "=" in maps[0].split("/")[0])


def cmd_profile(args) -> int:
    from ..io import load_tractogram, load_volume
    from ..pipelines.connectivity import compute_profile, profile_csv_text, write_text_atomic

    if (args.tractogram is None) == (args.bundles is None):
        raise InputError(
            "give a tractogram or --bundles OUTDIR (one of them)",
            fix="tractlens profile BUNDLE.trx --map FA.nii.gz, or tractlens profile --bundles OUTDIR --fit DTI_DIR",
        )
    if args.names and not args.bundles:
        raise InputError("--names chooses bundles of --bundles", fix="Add --bundles OUTDIR, or drop --names")
    if _tidy_form(args):
        from .tractometry import cmd_profile_bundles

        return cmd_profile_bundles(args)
    params = params_from_args(ProfileParams, args)
    check_device(args.device)
    check_output_file(args.output, "profile CSV")
    volume = load_volume(args.map[0])
    tract = load_tractogram(args.tractogram, reference=args.map[0])
    require_streamlines(tract, args.tractogram, "an along-tract profile")
    result = compute_profile(tract, volume, params.n_points, weighting=params.weighting, device=args.device)
    map_name = volume.name
    write_text_atomic(profile_csv_text(result, volume.affine, map_name), args.output)
    summary = {
        "input": str(args.tractogram),
        "map": str(args.map[0]),
        "output": str(args.output),
        "mean": [None if not np.isfinite(v) else float(v) for v in result.mean],
        **result.provenance,
    }
    emit(
        args,
        summary,
        f"{map_name} profile of {len(tract)} streamlines at {params.n_points} points "
        f"(mean {np.nanmean(result.mean):.4g}); written to {args.output}",
    )
    return EXIT_OK


def cmd_distance(args) -> int:
    from ..io import load_mask, load_tractogram, save_tractogram
    from ..io.nifti import load_image
    from ..pipelines.connectivity import compute_lesion_distance, distance_row, with_distances

    if (args.tractogram is None) == (args.envelopes is None):
        raise InputError(
            "give a tractogram or --envelopes DIR (one of them)",
            fix="tractlens distance TRACTOGRAM --lesion MASK, or tractlens distance --envelopes DIR --lesion MASK",
        )
    if args.envelopes is not None:
        from .envelopes import cmd_envelope_distance

        return cmd_envelope_distance(args)
    params = params_from_args(LesionDistanceParams, args)
    check_device(args.device)
    if args.output:
        from ..io.tractogram import check_output_suffix

        check_output_suffix(args.output)
    lesion = load_mask(args.lesion, what="lesion mask")
    affine = load_image(args.lesion, "lesion mask").affine
    tract = load_tractogram(args.tractogram, reference=args.lesion)
    distance = compute_lesion_distance(
        tract, lesion, affine, device=args.device, progress=Progress("distance", "streamlines", quiet=args.quiet)
    )
    row = distance_row(Path(args.tractogram).name, distance.per_streamline, params.margin_mm)
    if args.output:
        save_tractogram(with_distances(tract, distance), args.output)
    summary = {"input": str(args.tractogram), "lesion": str(args.lesion), "margin_mm": params.margin_mm,
               "output": args.output, **row.as_dict(), **distance.provenance}  # fmt: skip
    if row.streamlines == 0:  # an ordinary result: nothing comes near the lesion (no "inf" closest approach)
        summary["min_mm"] = None
        human = f"the tractogram holds 0 streamlines: none within {params.margin_mm:g} mm of the lesion"
    else:
        human = (
            f"closest approach {row.min_mm:.1f} mm; {row.within_margin} of {row.streamlines} streamlines "
            f"({row.percent_within:.1f} %) within {params.margin_mm:g} mm of the lesion"
        )
    emit(args, summary, human)
    return EXIT_OK
