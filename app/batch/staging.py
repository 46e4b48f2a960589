"""A batch run's staging folder (``DERIVATIVES/.staging/RUN``): where each subject-step writes
before its outputs are renamed into place.

A run that ends (done, failed, Ctrl+C, SIGTERM) removes its own. A run killed outright (SIGKILL,
a node lost) cannot: its folder holds the half-written files of the steps it was running (a
tractogram's parts are gigabytes). Each run therefore records its host and process in its
folder (``owner.json``), and the next run on that host removes the folders of runs whose process
is gone, and says so. Folders of live runs (two batches into one derivatives folder), of other
hosts (a shared file system) or PID namespaces (containers), and without an owner record are left
alone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

OWNER_FILE = "owner.json"


def _pid_namespace() -> str:
    """This process's PID namespace (Linux: ``pid:[inode]``; "" elsewhere): a process number means
    something only within it (containers sharing a host name have their own)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def claim_staging(staging: Path) -> None:
    """Create this run's staging folder with its owner record."""
    staging.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getpid(), "pid_namespace": _pid_namespace(),
              "started": time.time()}  # fmt: skip
    (staging / OWNER_FILE).write_text(json.dumps(record))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def clear_dead_runs(staging_root: Path, keep: Path | None = None) -> list[str]:
    """Remove the staging folders under ``staging_root`` of runs on this host whose process is
    gone; the names of those removed."""
    removed = []
    host = socket.gethostname()
    try:
        folders = [p for p in staging_root.iterdir() if p.is_dir() and p != keep]
    except OSError:
        return removed
    for folder in folders:
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
            pid = int(owner["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no record (or not readable): not ours to judge
        same = owner.get("host") == host and owner.get("pid_namespace") == _pid_namespace()
        if same and pid != os.getpid() and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder.name)
    return removed


def remove_staging(staging: Path) -> None:
    """This run's staging folder (what a killed or cancelled task left there), and the
    ``.staging`` folder above it when no other run uses it."""
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.parent.rmdir()
    except OSError:
        pass  # another run's staging is in there, or it is gone already
