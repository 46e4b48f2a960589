"""Sessions keep the document's registrations: written as registration folders inside the session
(a .tractlens file and the autosave's folder alike) and read back equal."""

import numpy as np
import pytest

from tractlens.app.grid import Grid
from tractlens.app.model import Document, Layer, Volume
from tractlens.app.session import SessionFolder, load_session, save_session, snapshot

pytest.importorskip("nitransforms")  # the anatomy extra: the test extra installs it


def _document_with_registrations():
    from tractlens.app.registration import Registration

    dwi = Grid(np.diag([2.0, 2.0, 2.0, 1.0]), (10, 12, 8))
    t1 = Grid(np.diag([1.0, 1.0, 1.0, 1.0]), (20, 24, 16))
    rotation = np.eye(4)
    rotation[:2, :2] = [[np.cos(0.1), -np.sin(0.1)], [np.sin(0.1), np.cos(0.1)]]
    rotation[:3, 3] = [1.5, -2.0, 0.5]
    rigid = Registration(dwi, t1, rotation, kind="rigid", fixed_name="b0", moving_name="T1w", metric="mi")
    field = np.random.default_rng(0).normal(0, 0.3, (*dwi.shape, 3)).astype(np.float32)
    syn = Registration(dwi, t1, np.eye(4), field, -field, kind="syn", fixed_name="b0", moving_name="FLAIR")
    doc = Document()
    doc.add_layer(Layer("b0", Volume("b0", np.ones(dwi.shape, np.float32), dwi.affine), "scalar"))
    doc.registrations = {"R1": rigid, "R2": syn}
    return doc


def _assert_same(reopened: dict, original: dict) -> None:
    assert list(reopened) == list(original)
    for key, registration in original.items():
        back = reopened[key]
        np.testing.assert_allclose(back.affine, registration.affine, atol=1e-6)
        assert back.fixed.matches(registration.fixed) and back.moving.matches(registration.moving)
        assert (back.kind, back.fixed_name, back.moving_name) == (
            registration.kind,
            registration.fixed_name,
            registration.moving_name,
        )
        assert back.describe() == registration.describe()
        if registration.warp is None:
            assert back.warp is None
        else:
            np.testing.assert_allclose(back.warp, registration.warp, atol=1e-5)
            np.testing.assert_allclose(back.inverse_warp, registration.inverse_warp, atol=1e-5)


def test_a_session_file_keeps_its_registrations(tmp_path):
    doc = _document_with_registrations()
    path = save_session(doc, tmp_path / "s.tractlens")
    session = load_session(path)
    _assert_same(session.document.registrations, doc.registrations)
    assert [entry["id"] for entry in session.manifest["registrations"]] == ["R1", "R2"]


def test_the_autosave_folder_keeps_registrations_and_rewrites_only_new_ones(tmp_path):
    doc = _document_with_registrations()
    folder = SessionFolder(tmp_path / "autosave")
    assert folder.write(snapshot(doc))
    written = (tmp_path / "autosave" / "registrations" / "R1" / "registration.json").stat().st_mtime_ns
    _assert_same(load_session(tmp_path / "autosave").document.registrations, doc.registrations)
    doc.registrations["R3"] = doc.registrations["R1"]
    assert folder.write(snapshot(doc))
    assert (tmp_path / "autosave" / "registrations" / "R1" / "registration.json").stat().st_mtime_ns == written
    assert list(load_session(tmp_path / "autosave").document.registrations) == ["R1", "R2", "R3"]


def test_a_session_without_registrations_opens_with_none(tmp_path):
    doc = _document_with_registrations()
    doc.registrations = {}
    assert load_session(save_session(doc, tmp_path / "plain.tractlens")).document.registrations == {}
