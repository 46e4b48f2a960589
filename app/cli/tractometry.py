"""``tractlens profile --bundles`` (the tidy table of every named bundle and map) and
``tractlens plot-profiles`` (the cohort's profiles per bundle, mean ± sd): tractometry
(:mod:`app.tractometry`, :mod:`app.tractometry_plot`)."""

from __future__ import annotations

from tractlens.gpu.backend import check_device

from ..errors import InputError
from ..io.outputs import check_output_file
from ..params import ProfileParams, ProfileTableParams
from ._common import EXIT_OK, Progress, emit
from .options import params_from_args


def add_parsers(sub, common) -> None:
    p = sub.add_parser(
        "plot-profiles",
        parents=[common],
        help="draw the profiles of a tidy table per bundle: the cohort's mean ± sd, each subject thin (PNG, SVG, PDF)",
        description="Reads the tidy CSV of tractlens profile --bundles or of the batch's profiles step (columns "
        "subject, session, bundle, node, metric, value) and draws one panel per bundle: each subject-session's "
        "profile as a thin line, the cohort's mean across them as a thick line and ± one sd (ddof 1) as a band. "
        "Needs matplotlib and pandas (the plot extra: pip install 'tractlens[plot]').",
    )
    p.add_argument("table", metavar="COHORT.csv", help="tidy profile table")
    p.add_argument("-o", "--output", required=True, metavar="IMAGE", help="figure file (.png, .svg or .pdf)")
    # not --metric: that flag is the registration's and geodesic tracking's similarity metric
    p.add_argument(
        "--measure", metavar="METRIC", help="the metric column's value to draw, e.g. FA (default: the first)"
    )
    p.add_argument("--bundles", nargs="+", metavar="NAME", help="only these bundles (default all, in table order)")
    p.set_defaults(func=cmd_plot_profiles)


def cmd_profile_bundles(args) -> int:
    from ..tractometry import profile_bundles
    from ..tractometry_table import write_profiles

    params = params_from_args(ProfileParams, args)
    table = params_from_args(ProfileTableParams, args)
    check_device(args.device)
    check_output_file(args.output, "profile table")
    names = [n for word in args.names or [] for n in word.split(",") if n]
    result = profile_bundles(
        args.bundles or args.tractogram,
        args.map or [],
        fit=args.fit,
        names=names or None,
        params=params,
        subject=table.subject,
        session=table.session,
        device=args.device,
        progress=Progress("profile", "bundles", quiet=args.quiet),
    )
    write_profiles(result, args.output)
    missing = {name: b for name, b in result.bundles.items() if b["status"] != "ok" or b["streamlines"] == 0}
    summary = {"input": str(args.bundles or args.tractogram), "output": str(args.output), **result.summary(),
               "rows": len(result.values) * result.n_points}  # fmt: skip
    profiled = len(result.bundles) - len(missing)
    listed = ", ".join(f"{name} ({record['status']})" for name, record in missing.items())
    empty = f"; empty: {listed}" if missing else ""
    emit(
        args,
        summary,
        f"{', '.join(result.maps)} profiles of {profiled} of {len(result.bundles)} bundles at {result.n_points} "
        f"points{empty}; written to {args.output}",
    )
    return EXIT_OK


def cmd_plot_profiles(args) -> int:
    from ..tractometry_plot import save_profiles_figure

    suffix = str(args.output).lower().rsplit(".", 1)[-1]
    if suffix not in ("png", "svg", "pdf"):
        raise InputError("the figure must be a .png, .svg or .pdf file", path=args.output, fix="Name it FIGURE.png")
    check_output_file(args.output, "figure")
    info = save_profiles_figure(args.table, args.output, metric=args.measure, bundles=args.bundles)
    emit(args, info, f"{info['metric']} profiles of {len(info['bundles'])} bundles, {info['subjects']} "
                     f"subject-sessions; written to {args.output}")  # fmt: skip
    return EXIT_OK
