"""The cohort's tract-profile table: every subject's tidy CSV of the ``profiles`` step gathered
into one (subject, session, bundle, node, metric, value), pyAFQ's group table, which pandas and
seaborn read as is. Written after the subject-steps, from the derivatives: this run's subjects whose
step is done or up to date, and the complete tables (with their sidecar) of subjects an earlier run
did (a run of some participants does not drop the others). A JSON sidecar names the subjects in it
and this run's subjects without a table (their step failed or did not run)."""

from __future__ import annotations

import json
from pathlib import Path

from ..io._atomic import write_text_atomic
from ..tractometry_table import concatenate_profiles
from .naming import sidecar_of
from .plan import Plan
from .steps import STEPS

#: The cohort table's name in the derivatives folder.
COHORT_TABLE = "tractometry_profiles.csv"
STEP = "profiles"
#: How every subject's table of the profiles step ends (its name after the subject's prefix).
_SUFFIX = STEPS[STEP].primary("", {})["profiles"]


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
    this_run = {Path(job.folder) / job.primary[0] for job in plan.jobs if job.step == STEP}
    for table in sorted(Path(derivatives).glob(f"sub-*/**/*{_SUFFIX}")):
        if table not in this_run and sidecar_of(table).is_file():  # an earlier run's, complete
            tables.append(table)
    if not tables:
        return None
    output = Path(derivatives) / COHORT_TABLE
    info = concatenate_profiles(sorted(tables), output)
    info["missing"] = missing
    sidecar = {"Description": "tract profiles of every subject (tractlens profile --bundles), one row per "
               "subject, session, bundle, node and metric", "Subjects": info["subjects"],
               "WithoutProfiles": missing, "Tables": info["tables"]}  # fmt: skip
    write_text_atomic(json.dumps(sidecar, indent=2), output.with_suffix(".json"))
    return info
