"""A full disk while saving: a clear error, the previous file intact, nothing half-written left.

The failure is real, not simulated: the writer runs in a child process whose file-size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored) makes the kernel refuse ``write()`` part-way through the
file, exactly where a full disk would (EFBIG instead of ENOSPC). ENOSPC's own wording is
checked separately.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tractlens.app.io._atomic import SaveError, atomic_path
from tractlens.app.model import Document, Layer, RoiMask, Tractogram, Volume
from tractlens.app.session import load_session, save_session

REPO = Path(__file__).resolve().parents[1]
LIMIT = 200_000  # bytes a child may write per file

CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    import numpy as np
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    from tractlens.app.errors import InputError
    from tractlens.app.model import Document, Layer, Tractogram, Volume
    rng = np.random.default_rng(0)
    target, what = sys.argv[1], sys.argv[2]
    try:
        if what == "session":
            from tractlens.app.session import save_session
            doc = Document()
            doc.add_layer(Layer("big", Volume("big", rng.normal(size=(64, 64, 40)).astype(np.float32), np.eye(4)), "scalar"))
            save_session(doc, target)
        elif what == "nifti":
            from tractlens.app.io import save_volume
            save_volume(rng.normal(size=(64, 64, 40)).astype(np.float32), np.eye(4), target)
        elif what == "trk":
            from tractlens.app.io import save_tractogram
            lines = [rng.normal(size=(200, 3)).astype(np.float32) + 20 for _ in range(400)]
            save_tractogram(Tractogram.from_list(lines, affine=np.eye(4), dimensions=(40, 40, 40)), target)
        print(json.dumps({{"ok": True}}))
    except InputError as exc:
        print(json.dumps({{"ok": False, "type": type(exc).__name__, "message": str(exc)}}))
    """
).format(limit=LIMIT)


def _save_in_child(target: Path, what: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(target), what], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _small_session(path: Path) -> Path:
    doc = Document()
    doc.add_layer(Layer("anat", Volume("anat", np.arange(60, dtype=np.float32).reshape(5, 4, 3), np.eye(4)), "scalar"))
    roi = RoiMask("seed 1", np.zeros((5, 4, 3), bool), np.eye(4))
    roi.mask[1:3, 1, 1] = True
    doc.add_layer(Layer("seed 1", roi, "roi"))
    return save_session(doc, path)


@pytest.mark.parametrize(
    ("what", "name"), [("session", "case.tractlens"), ("nifti", "map.nii.gz"), ("trk", "fibres.trk")]
)
def test_a_full_disk_keeps_the_previous_file_and_leaves_nothing_half_written(tmp_path, what, name):
    target = tmp_path / name
    if what == "session":
        _small_session(target)
    else:
        target.write_bytes(b"the previous version of this file")
    before = target.read_bytes()
    result = _save_in_child(target, what)
    assert result == {
        "ok": False,
        "type": "SaveError",
        "message": result["message"],
    }, result  # the documented error, not a crash
    message = result["message"]
    assert message.startswith(str(target)), message  # names the file the user asked for
    assert "larger than this file system" in message and "previous file was left as it was" in message
    assert "Free some space" in message
    assert target.read_bytes() == before  # intact
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary file or folder left
    if what == "session":
        assert [layer.name for layer in load_session(target).document.layers] == ["anat", "seed 1"]


def test_the_first_save_on_a_full_disk_writes_nothing(tmp_path):
    target = tmp_path / "new.tractlens"
    result = _save_in_child(target, "session")
    assert not result["ok"] and "nothing was written" in result["message"]
    assert list(tmp_path.iterdir()) == []


def test_disk_full_wording(tmp_path, monkeypatch):
    target = tmp_path / "notes.txt"
    target.write_text("old")
    with pytest.raises(SaveError) as caught:
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    text = str(caught.value)
    assert "the disk is full" in text and "MiB free there" in text and "previous file was left as it was" in text
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_cli_reports_a_full_disk_as_bad_input_without_a_traceback(tmp_path, demo_dir):
    """fit-dti's outputs under a file-size limit: exit 2, one message, no traceback."""
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))
        from tractlens.app.cli import main
        sys.exit(main(["fit-dti", {str(demo_dir / "dwi.nii.gz")!r}, "--device", "cpu", "-o", {str(tmp_path / "out")!r}]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "could not be saved" in out.stderr
    leftovers = [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_a_snapshot_is_not_changed_by_later_edits(tmp_path):
    """The window snapshots the document on the GUI thread and writes it on a worker: an ROI
    painted after the snapshot must not reach the file half-way."""
    from tractlens.app.session import snapshot, write_session

    doc = Document()
    doc.add_layer(Layer("anat", Volume("anat", np.zeros((5, 4, 3), np.float32), np.eye(4)), "scalar"))
    roi = doc.add_layer(Layer("seed 1", RoiMask("seed 1", np.zeros((5, 4, 3), bool), np.eye(4)), "roi"))
    tract = Tractogram.from_list([np.zeros((3, 3))], affine=np.eye(4), dimensions=(5, 4, 3))
    lines = doc.add_layer(Layer("lines", tract, "tractogram"))
    snap = snapshot(doc)
    doc.paint(roi, np.array([[1, 1, 1]]), True)  # after the snapshot
    roi.data.role = "exclusion"
    lines.set_selection(np.array([False]))
    restored = load_session(write_session(snap, tmp_path / "snap")).document
    assert not restored.layer("seed 1").data.mask.any() and restored.layer("seed 1").data.role == "seed"
    assert restored.layer("lines").selection is None
