"""Provenance of each output (its JSON sidecar) and the test that a step is already done.

A sidecar records the step, the command line, the parameters as the dataclasses read them,
every input with its size and modification time (a folder: its files'), the device and
version, the command's own summary and the step's time. A step is done, and skipped by the
next run, when all the outputs its last run wrote are there with their sidecars and that run's
inputs and parameters are the ones of this run: changed parameters, or a changed input file
(an earlier step run again), run it again. Size and time rather than a hash: hashing every
subject's DWI on every run would cost more than most steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .naming import sidecar_of


def fingerprint(path: Path) -> dict:
    """``{"path", "size", "mtime_ns"}`` of a file; of a folder, its files' total size and the
    latest time. A missing input raises :class:`FileNotFoundError`."""
    stat = path.stat()
    if not path.is_dir():
        return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    size, latest = 0, stat.st_mtime_ns
    for root, _dirs, files in os.walk(path):
        for name in files:
            entry = os.stat(os.path.join(root, name))
            size, latest = size + entry.st_size, max(latest, entry.st_mtime_ns)
    return {"path": str(path), "size": size, "mtime_ns": latest}


def normalised(value):
    """As it reads back from JSON (tuples become lists), so a stored record compares equal."""
    return json.loads(json.dumps(value, default=str))


def read_sidecar(output: Path) -> dict | None:
    try:
        return json.loads(sidecar_of(output).read_text())
    except (OSError, ValueError):
        return None


def is_done(primary: Path, inputs: dict, parameters: dict) -> bool:
    """Whether the step whose first output is ``primary`` was run with these inputs and parameters
    and all its outputs are complete (each there with its sidecar)."""
    record = read_sidecar(primary)
    if record is None or record.get("Inputs") != normalised(inputs):
        return False
    if record.get("Parameters") != normalised(parameters):
        return False
    for name in record.get("StepOutputs", ()):
        output = primary.parent / name
        if not output.exists() or not sidecar_of(output).exists():
            return False
    return True


def previous_outputs(primary: Path) -> list[Path]:
    """The outputs the last run of a step wrote (from its first output's sidecar)."""
    record = read_sidecar(primary) or {}
    return [primary.parent / name for name in record.get("StepOutputs", ())]
