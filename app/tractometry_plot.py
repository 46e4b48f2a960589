"""Figures of a tidy profile table: per bundle, each subject's profile thin and the cohort's
mean ± sd as a line and a band (as pyAFQ's and AFQ-Browser's tract-profile plots).

:func:`plot_profiles` returns a matplotlib :class:`~matplotlib.figure.Figure` (a notebook shows
it); ``tractlens plot-profiles`` saves one through :func:`save_profiles_figure`. matplotlib and
pandas are the ``plot`` extra, imported when a figure is drawn. No pyplot: the figure has its own
Agg canvas, so nothing here opens a window or depends on a GUI backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from .errors import InputError
from .tractometry import TIDY_COLUMNS

#: gid of the artists, so that a test or a notebook finds them: the mean line, the ± sd band and
#: each subject-session's line (``subject:SUB_SES``).
MEAN_GID, BAND_GID, SUBJECT_GID = "cohort-mean", "cohort-sd", "subject:"


def _require_plot_extra():
    try:
        import matplotlib  # noqa: F401
        import pandas
    except ImportError as exc:
        raise InputError(
            f"drawing profiles needs matplotlib and pandas, the plot extra ({exc.name} is missing)",
            fix="pip install 'tractlens[plot]'",
        ) from None
    return pandas


def profiles_frame(table):
    """The tidy table as a pandas DataFrame: a CSV path, a DataFrame (checked, not copied more
    than needed) or rows. Subject and session stay text; an empty value is NaN."""
    pandas = _require_plot_extra()
    if isinstance(table, (str, os.PathLike)):
        path = Path(table)
        try:
            frame = pandas.read_csv(path, dtype={"subject": str, "session": str, "bundle": str, "metric": str},
                                    keep_default_na=False, na_values={"value": [""]})  # fmt: skip
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the profile table ({exc})", path=path) from None
    elif isinstance(table, pandas.DataFrame):
        frame, path = table, None
    else:
        frame, path = pandas.DataFrame(list(table), columns=list(TIDY_COLUMNS)), None
    missing = [c for c in TIDY_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"not a tidy profile table: no column {', '.join(missing)}", path=path,
                         fix="Give the CSV of tractlens profile --bundles or of the batch's profiles step")  # fmt: skip
    if len(frame) == 0:
        raise InputError("the profile table has no rows", path=path)
    return frame


def cohort_summary(frame, metric: str, bundle: str):
    """``(nodes, mean, sd, per_subject)`` of one bundle and metric: across subject-sessions, the
    mean and sd (ddof 1) of their values at each node (NaN values left out); ``per_subject``:
    ``{"sub-01_ses-1": (nodes, values)}``."""
    part = frame[(frame["metric"] == metric) & (frame["bundle"] == bundle)]
    wide = part.assign(who=part["subject"].fillna("") + "_" + part["session"].fillna("")).pivot_table(
        index="node", columns="who", values="value", aggfunc="mean", dropna=False
    )
    nodes = wide.index.to_numpy()
    per_subject = {who.rstrip("_"): (nodes, wide[who].to_numpy()) for who in wide.columns}
    return (
        nodes,
        wide.mean(axis=1, skipna=True).to_numpy(),
        wide.std(axis=1, ddof=1, skipna=True).to_numpy(),
        per_subject,
    )


def _colour(bundle: str, index: int):
    try:  # the bundles' standard colours, where the named-bundles module is installed
        from .bundles import bundle_colour

        return tuple(bundle_colour(bundle))
    except Exception:  # not there yet, or a bundle it does not name: matplotlib's cycle
        return f"C{index % 10}"


def plot_profiles(table, metric: str | None = None, bundles: Sequence[str] | None = None, ax=None):
    """Draw the profiles of a tidy table (CSV path, DataFrame or rows) and return the Figure.

    One panel per bundle (``ax`` None), or every bundle on ``ax``. In each: every subject-session's
    profile thin, the cohort's mean thick (gid :data:`MEAN_GID`, one per bundle) and ± one sd as a
    band (gid :data:`BAND_GID`). ``metric``: default the table's first; ``bundles``: default all,
    in table order."""
    frame = profiles_frame(table)
    metrics = list(dict.fromkeys(frame["metric"]))
    metric = metric or metrics[0]
    if metric not in metrics:
        raise InputError(f"no metric {metric} in the table", fix=f"Choose among: {', '.join(metrics)}")
    present = list(dict.fromkeys(frame.loc[frame["metric"] == metric, "bundle"]))
    chosen = list(bundles) if bundles else present
    unknown = [b for b in chosen if b not in present]
    if unknown:
        raise InputError(f"no bundle {', '.join(unknown)} with {metric} in the table",
                         fix=f"Choose among: {', '.join(present)}")  # fmt: skip
    if ax is None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        columns = min(4, len(chosen))
        rows = math.ceil(len(chosen) / columns)
        figure = Figure(figsize=(3.2 * columns, 2.6 * rows), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(rows, columns, squeeze=False).ravel()
        for extra in axes[len(chosen) :]:
            extra.remove()
        axes = list(axes[: len(chosen)])
    else:
        figure, axes = ax.figure, [ax] * len(chosen)
    for index, (bundle, axis) in enumerate(zip(chosen, axes)):
        _draw_bundle(axis, frame, metric, bundle, _colour(bundle, index), label=ax is not None)
    if ax is not None and len(chosen) > 1:
        ax.legend(fontsize="small")
    return figure


def _draw_bundle(axis, frame, metric: str, bundle: str, colour, *, label: bool) -> None:
    nodes, mean, sd, per_subject = cohort_summary(frame, metric, bundle)
    for who, (x, values) in per_subject.items():
        axis.plot(x, values, color=colour, linewidth=0.6, alpha=0.35, gid=f"{SUBJECT_GID}{who}")
    axis.fill_between(nodes, mean - sd, mean + sd, color=colour, alpha=0.25, linewidth=0, gid=BAND_GID)
    axis.plot(nodes, mean, color=colour, linewidth=2.0, gid=MEAN_GID, label=bundle if label else None)
    if not label:
        axis.set_title(f"{bundle} (n = {len(per_subject)})", fontsize="medium")
    axis.set_xlabel("node")
    axis.set_ylabel(metric)
    axis.set_xlim(nodes.min(), nodes.max()) if len(nodes) > 1 else None


def save_profiles_figure(table, output: str | os.PathLike, *, metric: str | None = None,
                         bundles: Sequence[str] | None = None) -> dict:  # fmt: skip
    """Draw :func:`plot_profiles` and save it atomically; returns what was drawn."""
    from .io._atomic import atomic_path

    frame = profiles_frame(table)
    figure = plot_profiles(frame, metric=metric, bundles=bundles)
    drawn = [a.get_title().split(" (n = ")[0] for a in figure.axes]
    output = Path(output)
    with atomic_path(output) as temporary:
        figure.savefig(temporary, format=output.suffix.lstrip(".").lower(), dpi=120)
    metric = metric or next(iter(dict.fromkeys(frame["metric"])))
    subjects = frame[["subject", "session"]].drop_duplicates()
    return {"output": str(output), "metric": metric, "bundles": drawn, "subjects": len(subjects)}
