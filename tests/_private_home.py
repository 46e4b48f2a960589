"""The test suite never writes into the user's real home.

The process that runs the session (pytest, or pytest-xdist's controller) points ``HOME`` at a private
temporary folder before any test, worker or subprocess starts, and every process points the
``XDG_*`` base folders at private folders of its own (Qt's settings, the recovery autosaves, the
caches and every library that follows the XDG rules write there). All of the session's processes
inherit them, so a process of this session reaches the real home only if it ignores ``HOME`` too:
by reading the password database or a written-out path, which tests/test_private_home.py forbids in
the sources.

At the end of the session:

- anything of TractLens's (a name containing 'tractlens', any case) in the private home fails the
  run: code wrote there that followed ``HOME`` but ignored the ``XDG_*`` folders. Only this session
  knows that folder, so nobody else's process can fail the check;
- the TractLens entries of the real folders that changed during the run are *reported*, not
  failed: this machine is shared, and other people's TractLens runs write there (the session's own
  processes had another home).

Third-party caches that are not TractLens's and are costly to rebuild keep their real place
(:data:`KEPT`: DIPY's and AMICO's lookup tables, CuPy's compiled kernels) unless already set.
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

#: Caches of other libraries, under the real home, that keep their place: variable -> default.
KEPT = {"DIPY_HOME": ".dipy", "CUPY_CACHE_DIR": ".cupy/kernel_cache"}

#: Set to the private home by the session's first process; its workers and subprocesses inherit it.
MARK = "TRACTLENS_TESTS_HOME"


def default_folders(home: Path) -> dict[str, Path]:
    """The XDG base folders a program uses under ``home`` when the ``XDG_*`` variables are unset."""
    return {name: home / default for name, default in XDG_DEFAULTS.items()}


def real_folders() -> dict[str, Path]:
    """The user's real XDG base folders (as the environment had them before the tests)."""
    return {name: Path(os.environ.get(name) or home) for name, home in default_folders(Path.home()).items()}


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
    """Points ``HOME`` (first process of a session only) and the XDG variables at private folders;
    :meth:`leaks` says what the session wrote where it must not, :meth:`foreign_changes` what
    changed in the real folders meanwhile."""

    def __init__(self):
        self.owner = MARK not in os.environ  # False in pytest-xdist's workers: the session's home is set
        self.real = real_folders()
        self.before = tractlens_entries(self.real) if self.owner else {}
        self.root = Path(tempfile.mkdtemp(prefix="tractlens-tests-home-"))
        self.saved = {name: os.environ.get(name) for name in (*XDG_DEFAULTS, *KEPT, "HOME", MARK)}
        if self.owner:
            for name, default in KEPT.items():
                os.environ.setdefault(name, str(Path.home() / default))
            home = self.root / "home"
            home.mkdir()
            os.environ["HOME"] = os.environ[MARK] = str(home)
        self.home = Path(os.environ[MARK])
        for name in XDG_DEFAULTS:
            folder = self.root / "xdg" / name.lower()
            folder.mkdir(parents=True)
            os.environ[name] = str(folder)

    def leaks(self) -> list[str]:
        """TractLens's entries in the private home (the session's first process only)."""
        if not self.owner:
            return []
        found = tractlens_entries({"HOME": self.home, **default_folders(self.home)})
        return sorted(f"{path} (under HOME: the XDG_* folders were ignored)" for path in found)

    def foreign_changes(self) -> list[str]:
        """TractLens's entries of the real folders that appeared, changed or disappeared."""
        if not self.owner:
            return []
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
