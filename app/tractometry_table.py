"""The tidy profile table on disk: one subject's CSV or JSON, and the cohort's CSV made of them.

Columns :data:`~.tractometry.TIDY_COLUMNS` (subject, session, bundle, node, metric, value), one
row per node of a bundle's profile of one metric: pyAFQ's long table, which
``pandas.read_csv(PATH)`` and seaborn take as is. Subjects and sessions keep their BIDS prefix
(``sub-01``, ``ses-pre``) so that pandas reads them as text, not as the number 1. An empty value
is a node without a sample (a bundle without streamlines: its status is in the JSON output and
the command's summary). Files are written atomically (a temporary file, then a rename).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import InputError
from .io._atomic import write_text_atomic
from .tractometry import TIDY_COLUMNS, TractometryResult

#: ``format`` of the JSON output.
PROFILES_FORMAT = "tractlens-profiles"


def _value_text(value: float) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.7g}"


def tidy_csv_text(rows: Iterable[Sequence]) -> str:
    """The CSV of tidy rows (subject, session, bundle, node, metric, value), with its header."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TIDY_COLUMNS)
    for subject, session, bundle, node, metric, value in rows:
        writer.writerow([subject, session, bundle, int(node), metric, _value_text(value)])
    return out.getvalue()


def profiles_json(result: TractometryResult) -> dict:
    """The JSON output: the rows (value null where empty) and each bundle's status."""
    rows = [dict(zip(TIDY_COLUMNS, (*row[:5], None if not math.isfinite(row[5]) else row[5]))) for row in result.rows()]
    return {"format": PROFILES_FORMAT, "version": 1, "columns": list(TIDY_COLUMNS), **result.summary(), "rows": rows}


def write_profiles(result: TractometryResult, path: str | os.PathLike) -> Path:
    """``.json`` → :func:`profiles_json`; anything else → the tidy CSV."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        return write_text_atomic(json.dumps(profiles_json(result), indent=1), path)
    return write_text_atomic(tidy_csv_text(result.rows()), path)


def read_profiles(path: str | os.PathLike) -> list[tuple]:
    """The rows of a tidy CSV (value NaN where empty); :class:`InputError` if it is not one."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read the profile table ({exc.strerror or exc})", path=path) from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(header) != TIDY_COLUMNS:
        raise InputError(f"not a tidy profile table: its columns are {header}, not {', '.join(TIDY_COLUMNS)}",
                         path=path, fix="Give a CSV of tractlens profile --bundles")  # fmt: skip
    rows = []
    for number, row in enumerate(reader, start=2):
        try:
            subject, session, bundle, node, metric, value = row
            rows.append((subject, session, bundle, int(node), metric, float(value) if value else math.nan))
        except ValueError:
            raise InputError(f"line {number} is not subject, session, bundle, node, metric, value", path=path,
                             fix="Write the table again with tractlens profile") from None  # fmt: skip
    return rows


def concatenate_profiles(tables: Sequence[str | os.PathLike], output: str | os.PathLike) -> dict:
    """One cohort CSV made of the subjects' tidy CSVs (in the order given; each checked). Returns
    ``{"output", "tables", "rows", "subjects"}``."""
    if not tables:
        raise InputError("no subject's profile table to gather", fix="Run the profiles step first")
    rows: list[tuple] = []
    for table in tables:
        rows += read_profiles(table)
    write_text_atomic(tidy_csv_text(rows), output)
    subjects = sorted({(r[0], r[1]) for r in rows})
    return {"output": str(output), "tables": [str(t) for t in tables], "rows": len(rows),
            "subjects": [f"{s}_{e}" if e else s for s, e in subjects]}  # fmt: skip
