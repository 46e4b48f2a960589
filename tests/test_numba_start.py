"""A read-only installation run without a writable home: numba's cache goes to a private
temporary folder instead of every compiled loop failing to be defined."""

from __future__ import annotations

import os
import subprocess
import sys

from tractlens.app._numba_start import numba_cache_fallback


def test_without_a_writable_place_the_cache_goes_to_a_private_temporary_folder(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    blocker = tmp_path / "a-file"  # nothing can be created below a file (even by root)
    blocker.write_text("x")
    environ = {"HOME": str(blocker)}
    folder = numba_cache_fallback(source=blocker / "gpu", environ=environ)
    assert folder is not None and environ["NUMBA_CACHE_DIR"] == folder and folder.startswith(str(tmp_path))
    assert os.path.isdir(folder) and (os.stat(folder).st_mode & 0o777) == 0o700


def test_a_writable_install_or_home_or_the_users_own_setting_is_left_alone(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert numba_cache_fallback(source=tmp_path / "gpu", environ={"HOME": str(blocker)}) is None  # beside the source
    assert numba_cache_fallback(source=blocker / "gpu", environ={"HOME": str(tmp_path)}) is None  # ~/.cache/numba
    mine = {"HOME": str(blocker), "NUMBA_CACHE_DIR": "/somewhere"}
    assert (
        numba_cache_fallback(source=blocker / "gpu", environ=mine) is None and mine["NUMBA_CACHE_DIR"] == "/somewhere"
    )


def test_numba_then_defines_cached_functions_where_it_had_no_locator(tmp_path):
    """numba with only the user-provided locator (what is left without a writable install or home)
    refuses ``cache=True`` functions; after the fallback it defines and runs them."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    (tmp_path / "loops_mod.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n")
    script = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
import numba.core.caching as caching
caching.CacheImpl._locator_classes = [caching.UserProvidedCacheLocator]
try:
    import loops_mod
    raise SystemExit("defined without a cache folder: the simulation does not hold")
except RuntimeError as exc:
    assert "no locator" in str(exc), exc
from pathlib import Path
from tractlens.app._numba_start import numba_cache_fallback
assert numba_cache_fallback(source=Path({str(blocker)!r}) / "gpu") is not None
import loops_mod
print(loops_mod.f(41))
"""
    env = {**os.environ, "HOME": str(blocker), "TMPDIR": str(tmp_path)}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("XDG_CACHE_HOME", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"


def test_a_folder_of_that_name_made_by_someone_else_is_not_used(tmp_path, monkeypatch):
    """The name is predictable: a folder another user made first (here: open to all) could hold
    planted cache files, which numba would load."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    planted = tmp_path / "tmp" / f"tractlens-numba-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    folder = numba_cache_fallback(source=blocker / "gpu", environ={"HOME": str(blocker)})
    assert folder is not None and folder != str(planted) and folder.startswith(str(tmp_path / "tmp"))
    assert (os.stat(folder).st_mode & 0o777) == 0o700
