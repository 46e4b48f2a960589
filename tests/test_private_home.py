"""The suite's private home (tests/_private_home.py): where the session's processes write, what
fails the run, and that the sources find the home only through HOME and the XDG variables."""

from __future__ import annotations

import ast
import os
import pwd
from pathlib import Path

from tests._private_home import KEPT, MARK, XDG_DEFAULTS, PrivateHome

ROOT = Path(__file__).resolve().parents[1]


def test_this_process_runs_with_a_private_home_and_private_xdg_folders(monkeypatch):
    from tractlens.app.demo import cache_dir
    from tractlens.app.recovery import recovery_root

    real = Path(pwd.getpwuid(os.getuid()).pw_dir)
    home = Path(os.environ["HOME"])
    assert home == Path(os.environ[MARK]) == Path.home() and "tractlens-tests-home-" in str(home)
    assert not home.is_relative_to(real)
    for name in XDG_DEFAULTS:
        folder = Path(os.environ[name])
        assert "tractlens-tests-home-" in str(folder) and not folder.is_relative_to(home), name
    state = Path(os.environ["XDG_STATE_HOME"])
    assert recovery_root().is_relative_to(state)
    monkeypatch.delenv("TRACTLENS_CACHE")  # the suite's own demo cache; without it, the XDG cache
    assert cache_dir().is_relative_to(Path(os.environ["XDG_CACHE_HOME"]))
    assert all(name in os.environ for name in KEPT)  # other libraries' caches keep a place


def _session(tmp_path, monkeypatch) -> tuple[Path, PrivateHome]:
    """A PrivateHome as a session's first process makes it, over a fake 'real' home."""
    real = tmp_path / "real"
    real.mkdir()
    monkeypatch.delenv(MARK)
    monkeypatch.setenv("HOME", str(real))
    for name in (*XDG_DEFAULTS, *KEPT):
        monkeypatch.delenv(name, raising=False)
    return real, PrivateHome()


def test_tractlens_files_under_the_private_home_fail_and_the_xdg_folders_do_not(tmp_path, monkeypatch):
    real, home = _session(tmp_path, monkeypatch)
    try:
        assert home.owner and Path.home() == home.home != real
        assert os.environ["DIPY_HOME"] == str(real / ".dipy")  # resolved before HOME moved
        (Path(os.environ["XDG_CACHE_HOME"]) / "tractlens").mkdir()  # following XDG: fine
        (Path.home() / ".cache" / "other-app").mkdir(parents=True)  # not ours
        assert home.leaks() == [] and home.foreign_changes() == []
        (Path.home() / ".config" / "TractLens").mkdir(parents=True)  # HOME followed, XDG ignored
        (Path.home() / ".config" / "TractLens" / "TractLens.conf").write_text("[x]\n")
        leaks = home.leaks()
        assert len(leaks) == 2 and all("the XDG_* folders were ignored" in line for line in leaks)
        assert leaks[1].startswith(str(Path.home() / ".config" / "TractLens" / "TractLens.conf"))
    finally:
        home.close()
    assert not home.root.exists()


def test_changes_in_the_real_folders_are_reported_apart(tmp_path, monkeypatch):
    real, home = _session(tmp_path, monkeypatch)
    try:
        recovery = real / ".local" / "state" / "tractlens" / "recovery"
        recovery.mkdir(parents=True)  # someone else's TractLens, beside the suite
        assert home.leaks() == []
        assert home.foreign_changes() == [
            f"{real / '.local' / 'state' / 'tractlens'} appeared",
            f"{recovery} appeared",
        ]
    finally:
        home.close()


def test_a_worker_keeps_the_session_home_and_makes_its_own_xdg_folders():
    worker = PrivateHome()  # this process already has the session's home, as an xdist worker does
    try:
        assert not worker.owner and worker.home == Path(os.environ["HOME"]) == Path(os.environ[MARK])
        assert Path(os.environ["XDG_CONFIG_HOME"]).is_relative_to(worker.root)
        assert worker.leaks() == [] and worker.foreign_changes() == []
    finally:
        worker.close()
    assert Path(os.environ["XDG_CONFIG_HOME"]).is_dir()  # the session's own folders are back


#: What finds the home without HOME: the password database.
BYPASSES = {"pwd", "getpwuid", "getpwnam", "getpass", "getuser"}


def _bypasses(node) -> list[str]:
    """The names of ``node`` that find the home without HOME, or a home folder written out."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [
            name for name in [getattr(node, "module", None) or "", *(a.name for a in node.names)] if name in BYPASSES
        ]
    if isinstance(node, ast.Attribute) and node.attr in BYPASSES:
        return [node.attr]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
        if text.startswith(("/root", "/home/", "/Users/")) or (text[:1] == "~" and text[1:2].isalnum()):
            return [repr(text)]
    return []


def test_the_sources_find_the_home_only_through_home_and_xdg():
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno} {name}"
        for package in ("app", "gpu", "widgets")
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for name in _bypasses(node)
    ]
    assert offenders == [], "\n".join(offenders)
    assert _bypasses(ast.parse("import pwd").body[0]) == ["pwd"]  # the check sees what it looks for
    assert _bypasses(ast.parse("x = '~alice/.config'").body[0].value) == ["'~alice/.config'"]
