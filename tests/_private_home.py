"""The test suite never touches the user's real configuration, cache, state or data folders.

At start-up every ``XDG_*`` base folder points into a private temporary folder (Qt's settings,
the recovery autosaves, the demo cache and every library that follows the XDG rules write
there), and the TractLens entries of the real folders are listed; at the end they are listed
again and any difference fails the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: XDG base-folder variables and their defaults under the home folder.
XDG_DEFAULTS = {
    "XDG_CONFIG_HOME": ".config",
    "XDG_CACHE_HOME": ".cache",
    "XDG_STATE_HOME": ".local/state",
    "XDG_DATA_HOME": ".local/share",
}


def real_folders() -> dict[str, Path]:
    """The user's real XDG base folders (as the environment had them before the tests)."""
    home = Path.home()
    return {name: Path(os.environ.get(name) or home / default) for name, default in XDG_DEFAULTS.items()}


def tractlens_entries(folders: dict[str, Path]) -> dict[str, tuple[int, int]]:
    """Every file and folder of TractLens's (any name containing 'tractlens', any case) in
    ``folders``, with (size, mtime_ns)."""
    found = {}
    for base in folders.values():
        if not base.is_dir():
            continue
        for top in base.iterdir():
            if "tractlens" not in top.name.lower():
                continue
            for path in [top, *(top.rglob("*") if top.is_dir() else ())]:
                try:
                    stat = path.lstat()
                except OSError:
                    continue
                found[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return found


class PrivateHome:
    """Points the XDG variables at a private folder; :meth:`leaks` says what changed outside."""

    def __init__(self):
        self.real = real_folders()
        self.before = tractlens_entries(self.real)
        self.root = Path(tempfile.mkdtemp(prefix="tractlens-tests-xdg-"))
        self.saved = {name: os.environ.get(name) for name in XDG_DEFAULTS}
        for name in XDG_DEFAULTS:
            folder = self.root / name.lower()
            folder.mkdir()
            os.environ[name] = str(folder)

    def leaks(self) -> list[str]:
        after = tractlens_entries(self.real)
        return sorted(
            f"{path} {'appeared' if path not in self.before else 'changed'}"
            for path, stat in after.items()
            if self.before.get(path) != stat
        ) + sorted(f"{path} disappeared" for path in self.before if path not in after)

    def close(self) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(self.root, ignore_errors=True)
