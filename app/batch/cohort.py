"""The cohort's tract-profile table: every subject's tidy CSV of the ``profiles`` step gathered
into one (subject, session, bundle, node, metric, value), pyAFQ's group table, which pandas and
seaborn read as is. Written after the subject-steps, from the derivatives (this run's outputs and
those an earlier run left up to date), with a JSON sidecar naming the subjects in it and those
without a table (their step failed or did not run)."""

from __future__ import annotations

import json
from pathlib import Path

from ..io._atomic import write_text_atomic
from ..tractometry_table import concatenate_profiles
from .plan import Plan

#: The cohort table's name in the derivatives folder.
COHORT_TABLE = "tractometry_profiles.csv"
STEP = "profiles"


def write_cohort_profiles(plan: Plan, results: list[dict], derivatives: Path) -> dict | None:
    """Gather the profiles of every subject whose ``profiles`` step is done or up to date into
    ``derivatives/`` :data:`COHORT_TABLE`; None when the run has no profiles step or no subject
    has a table (nothing is written then)."""
    if STEP not in plan.steps:
        return None
    status = {(r["step"], r["subject"]): r["status"] for r in results}
    tables, missing = [], []
    for job in plan.jobs:
        if job.step != STEP:
            continue
        table = Path(job.folder) / job.primary[0]
        if status.get((STEP, job.subject)) in ("done", "skipped") and table.is_file():
            tables.append(table)
        else:
            missing.append(job.subject)
    if not tables:
        return None
    output = Path(derivatives) / COHORT_TABLE
    info = concatenate_profiles(tables, output)
    info["missing"] = missing
    sidecar = {"Description": "tract profiles of every subject (tractlens profile --bundles), one row per "
               "subject, session, bundle, node and metric", "Subjects": info["subjects"],
               "WithoutProfiles": missing, "Tables": info["tables"]}  # fmt: skip
    write_text_atomic(json.dumps(sidecar, indent=2), output.with_suffix(".json"))
    return info
