"""Where numba keeps the CPU engines' compiled loops when neither of its own places can be written.

numba caches each ``njit(cache=True)`` function beside its source (``gpu/__pycache__``), else in
the user's cache folder (``~/.cache/numba``). A read-only installation run by a user without a
writable home (``nobody``, a container started with ``--user``) has neither, and numba refuses to
define the functions at all ("cannot cache function …: no locator available"): every command
with a compiled loop failed. Then, and only then, ``NUMBA_CACHE_DIR`` is pointed at a private
folder under the temporary directory, before numba is imported. A ``NUMBA_CACHE_DIR`` the user set
is left as it is.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path


def _writable(folder: Path) -> bool:
    """Whether ``folder`` can be created (its nearest existing ancestor is writable) or written."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


def _private(folder: Path) -> bool:
    """A real folder (not a link) of this user that no one else may write or read: numba loads
    what is in its cache (pickles), so a folder another user could fill is not one to use."""
    info = os.lstat(folder)
    owner_ok = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    return stat.S_ISDIR(info.st_mode) and owner_ok and (info.st_mode & 0o077) == 0


def numba_cache_fallback(source: Path | None = None, environ: dict | None = None) -> str | None:
    """Set ``NUMBA_CACHE_DIR`` to a private temporary folder when numba would find no place for
    its cache (``source``: the folder of the compiled modules, ``gpu/``; ``environ``: this
    process's environment, or a dict to fill instead); the folder, or None when nothing was changed."""
    process = environ is None
    environ = os.environ if environ is None else environ
    if environ.get("NUMBA_CACHE_DIR"):
        return None
    source = source or Path(__file__).resolve().parent.parent / "gpu"
    cache_home = Path(environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME") or "/nonexistent") / ".cache")
    if _writable(source / "__pycache__") or _writable(cache_home / "numba"):
        return None
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    folder = Path(tempfile.gettempdir()) / f"tractlens-numba-{uid}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        if not _private(folder):  # made by someone else (a predictable name in a shared folder): not used
            folder = Path(tempfile.mkdtemp(prefix="tractlens-numba-"))  # this process's own, 0700
    except OSError:
        return None  # nowhere at all: numba says so when a compiled loop is defined
    environ["NUMBA_CACHE_DIR"] = str(folder)
    numba = sys.modules.get("numba") if process else None
    if numba is not None:  # imported already (read at import): its setting too
        numba.config.CACHE_DIR = str(folder)
    return str(folder)
