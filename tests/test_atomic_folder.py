"""``atomic_folder``: an output folder is built beside its name and renamed into place, so a
failure or a cancel inside leaves the previous folder as it was and no staging folder behind."""

from __future__ import annotations

import os

import pytest

from tractlens.app.io import atomic_folder
from tractlens.app.jobs import Cancelled


def _listing(folder):
    return sorted((p.relative_to(folder).as_posix(), p.read_text()) for p in folder.rglob("*") if p.is_file())


def _old_folder(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_text("old a")
    (out / "sub" / "b.txt").write_text("old b")
    return out


def test_success_replaces_the_previous_folder_and_leaves_no_staging(tmp_path):
    out = _old_folder(tmp_path)
    with atomic_folder(out) as staging:
        assert staging.parent == out.parent and staging != out and staging.is_dir()
        assert list(staging.iterdir()) == []
        (staging / "c.txt").write_text("new c")
        assert _listing(out) == [("a.txt", "old a"), ("sub/b.txt", "old b")]  # untouched until the end
    assert _listing(out) == [("c.txt", "new c")]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_first_write_creates_the_folder_and_its_parents(tmp_path):
    out = tmp_path / "deep" / "er" / "out"
    with atomic_folder(out) as staging:
        (staging / "x.txt").write_text("x")
    assert _listing(out) == [("x.txt", "x")]
    assert sorted(os.listdir(out.parent)) == ["out"]


@pytest.mark.parametrize("error", [RuntimeError("boom"), Cancelled(), KeyboardInterrupt()])
def test_a_failure_inside_keeps_the_previous_folder_and_removes_the_staging(tmp_path, error):
    out = _old_folder(tmp_path)
    with pytest.raises(type(error)):
        with atomic_folder(out) as staging:
            (staging / "half.txt").write_text("half written")
            (staging / "nested").mkdir()
            raise error
    assert _listing(out) == [("a.txt", "old a"), ("sub/b.txt", "old b")]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_failed_rename_puts_the_previous_folder_back(tmp_path, monkeypatch):
    out = _old_folder(tmp_path)
    real_rename = type(out).rename

    def rename(self, target):
        if self.name == ".out.partial":
            raise OSError(28, "No space left on device")
        return real_rename(self, target)

    monkeypatch.setattr(type(out), "rename", rename)
    with pytest.raises(OSError):
        with atomic_folder(out) as staging:
            (staging / "c.txt").write_text("new c")
    assert _listing(out) == [("a.txt", "old a"), ("sub/b.txt", "old b")]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_staging_folder_left_by_a_killed_run_is_cleared_first(tmp_path):
    out = tmp_path / "out"
    stale = tmp_path / ".out.partial"
    stale.mkdir()
    (stale / "stale.txt").write_text("from a killed run")
    with atomic_folder(out) as staging:
        assert list(staging.iterdir()) == []
        (staging / "c.txt").write_text("new c")
    assert _listing(out) == [("c.txt", "new c")]
    assert sorted(os.listdir(tmp_path)) == ["out"]
