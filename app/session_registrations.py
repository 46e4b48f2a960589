"""The registrations of a session: each one kept as the folder ``tractlens register`` writes
(:func:`app.io.transforms.save_registration`: ITK/ANTs transform files and ``registration.json``)
under ``registrations/ID/`` of the session, so that another tool can read it too, and read back
with :func:`app.io.transforms.load_registration` when the session is opened.

The manifest lists them as ``{"id", "describe", "files"}`` under ``"registrations"``; layers
placed by one name its id in their provenance (:mod:`app.anatomy_layers`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

FOLDER = "registrations"


def write_registrations(registrations: dict, folder: Path, written: dict | None = None) -> list[dict]:
    """Write each registration (id -> Registration) to ``folder/ID/`` and return the manifest's
    entries. ``written`` (id -> the registration object written there before, kept by the
    autosave's folder writer) skips one already written unchanged."""
    from .io.transforms import save_registration

    entries = []
    for registration_id, registration in registrations.items():
        target = Path(folder) / registration_id
        if written is None or written.get(registration_id) is not registration or not target.is_dir():
            save_registration(registration, target, {"kept_in_session": True})
            if written is not None:
                written[registration_id] = registration
        files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
        entries.append(
            {"id": registration_id, "folder": registration.folder, "describe": registration.describe(), "files": files}
        )
    return entries


def read_registrations(entries, folder: Path) -> dict:
    """The registrations a manifest lists (id -> Registration), read from ``folder/ID/``;
    :class:`InputError` when one is missing or damaged."""
    from .io.transforms import load_registration

    out = {}
    for entry in entries or []:
        registration = load_registration(Path(folder) / str(entry["id"]))
        # where the user made or opened it, not the temporary folder the session was unpacked to
        out[str(entry["id"])] = dataclasses.replace(registration, folder=entry.get("folder"))
    return out


def archive_name(name: str) -> str | None:
    """The path under the session's ``registrations/`` folder of an archive member (None: not a
    registration file, or a name that would leave the folder)."""
    if not name.startswith(f"{FOLDER}/"):
        return None
    parts = name[len(FOLDER) + 1 :].split("/")
    if len(parts) < 2 or any(part in ("", ".", "..") for part in parts):
        return None
    return "/".join(parts)
