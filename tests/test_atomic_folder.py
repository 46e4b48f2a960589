"""``atomic_folder``: an output folder is built beside its name and renamed into place, so a
failure or a cancel inside leaves the previous folder as it was and no staging folder behind; a
folder is replaced only when it is new, empty or an earlier output of the same kind (its marker
file) holding none of the inputs: never a folder of the user's other files."""

from __future__ import annotations

import os

import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import atomic_folder as _atomic_folder
from tractlens.app.jobs import Cancelled

MARK = "made.json"


def atomic_folder(path, inputs=()):
    return _atomic_folder(path, MARK, "test output", inputs)


def _listing(folder):
    return sorted((p.relative_to(folder).as_posix(), p.read_text()) for p in folder.rglob("*") if p.is_file())


def _old_folder(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_text("old a")
    (out / "sub" / "b.txt").write_text("old b")
    (out / MARK).write_text("{}")  # an earlier output of the same kind
    return out


def test_success_replaces_the_previous_folder_and_leaves_no_staging(tmp_path):
    out = _old_folder(tmp_path)
    with atomic_folder(out) as staging:
        assert staging.parent == out.parent and staging != out and staging.is_dir()
        assert list(staging.iterdir()) == []
        (staging / "c.txt").write_text("new c")
        assert _listing(out) == [("a.txt", "old a"), (MARK, "{}"), ("sub/b.txt", "old b")]  # untouched until the end
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
    assert _listing(out) == [("a.txt", "old a"), (MARK, "{}"), ("sub/b.txt", "old b")]
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
    assert _listing(out) == [("a.txt", "old a"), (MARK, "{}"), ("sub/b.txt", "old b")]
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


def test_a_folder_of_other_files_is_refused_and_kept(tmp_path):
    """``register -o SUBJECT_FOLDER`` deleted the subject's images: the folder was replaced whole."""
    out = tmp_path / "subject"
    out.mkdir()
    (out / "t1.nii.gz").write_text("the user's image")
    with pytest.raises(InputError, match="holds other files"):
        with atomic_folder(out):
            pass
    assert _listing(out) == [("t1.nii.gz", "the user's image")]
    assert sorted(os.listdir(tmp_path)) == ["subject"]


def test_an_empty_folder_is_used(tmp_path):
    (tmp_path / "out").mkdir()
    with atomic_folder(tmp_path / "out") as staging:
        (staging / "x.txt").write_text("x")
    assert _listing(tmp_path / "out") == [("x.txt", "x")]


@pytest.mark.parametrize("where", ["in", "is"])
def test_an_earlier_output_holding_an_input_is_refused(tmp_path, where):
    out = _old_folder(tmp_path)
    source = out / "a.txt" if where == "in" else out
    with pytest.raises(InputError, match="is or holds the input"):
        with atomic_folder(out, inputs=(str(source),)):
            pass
    assert (out / "a.txt").read_text() == "old a"


def test_the_current_folder_or_one_above_it_is_refused(tmp_path, monkeypatch):
    out = _old_folder(tmp_path)
    monkeypatch.chdir(out / "sub")
    for given in (str(out), ".."):
        with pytest.raises(InputError, match="current folder or holds it"):
            with atomic_folder(given):
                pass
    with pytest.raises(InputError, match="holds other files"):  # "." is sub/, which holds b.txt only
        with atomic_folder("."):
            pass
    with pytest.raises(InputError, match="can be written to"):
        with atomic_folder("/"):
            pass
    assert _listing(out) == [("a.txt", "old a"), (MARK, "{}"), ("sub/b.txt", "old b")]


def test_files_put_into_the_folder_during_the_run_are_not_deleted(tmp_path):
    """Checked again at the end: a folder that became someone's during a long run is kept."""
    out = tmp_path / "out"
    with pytest.raises(InputError, match="holds other files"):
        with atomic_folder(out) as staging:
            (staging / "x.txt").write_text("x")
            out.mkdir()
            (out / "notes.txt").write_text("mine")
    assert _listing(out) == [("notes.txt", "mine")]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_an_earlier_output_with_files_it_did_not_write_is_refused(tmp_path):
    """A record that lists its files (a registration's) marks any other file as the user's."""
    out = tmp_path / "out"
    out.mkdir()
    (out / MARK).write_text('{"files": ["a.txt", "made.json"]}')
    (out / "a.txt").write_text("ours")
    with atomic_folder(out) as staging:  # only what it wrote: replaced
        (staging / "a.txt").write_text("new")
        (staging / MARK).write_text('{"files": ["a.txt", "made.json"]}')
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(InputError, match=r"did not write \(notes\.txt\)"):
        with atomic_folder(out):
            pass
    assert (out / "notes.txt").read_text() == "the user's" and (out / "a.txt").read_text() == "new"


def test_an_earlier_output_without_a_files_list_keeps_the_users_files_by_its_templates(tmp_path):
    """An earlier bundles folder (its summary lists no files) holding the user's edited ROI:
    refused, as any file its templates do not name; only the command's own files: replaced."""
    out = tmp_path / "out"
    out.mkdir()
    (out / MARK).write_text("{}")
    (out / "AF_L.trx").write_text("ours")
    (out / "my_roi.nii.gz").write_text("the user's")
    with pytest.raises(InputError, match=r"did not write \(my_roi\.nii\.gz\)"):
        with _atomic_folder(out, MARK, "test output", (), ("AF_L.trx", MARK)):
            pass
    (out / "my_roi.nii.gz").unlink()
    with _atomic_folder(out, MARK, "test output", (), ("AF_L.trx", MARK)) as staging:
        (staging / "AF_L.trx").write_text("new")
    assert (out / "AF_L.trx").read_text() == "new"
