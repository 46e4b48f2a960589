"""The positions check of a .trx left for after the first frame (issue 41): ``check_positions=False``
opens without it, :func:`app.loaders.check_opened` refuses afterwards what opening refused (the
same message), and nothing meanwhile takes a NaN for a position: conversions refuse it, a session
or autosave runs the check before copying the file's positions, :func:`withdraw_opened` leaves the
document as it was."""

from __future__ import annotations

import threading
import zipfile

import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import load_tractogram, save_tractogram
from tractlens.app.io import tractogram as tractogram_io
from tractlens.app.io.tractogram_exact import save_tractogram_exact
from tractlens.app.loaders import check_opened, check_pending, load_layers, withdraw_opened
from tractlens.app.model import Document, Layer, Tractogram, Volume

AFFINE = np.array([[-1.25, 0.02, 0, 90], [0.01, 1.25, 0, -126], [0, 0, 1.25, -72], [0, 0, 0, 1]])


def _trx(tmp_path, name="t.trx", bad=None, n=200, points=40):
    rng = np.random.default_rng(0)
    pts = (np.cumsum(rng.normal(scale=0.4, size=(n, points, 3)), axis=1) + 60).reshape(-1, 3).astype(np.float32)
    path = save_tractogram(Tractogram(pts, np.arange(0, n * points + 1, points), AFFINE, (145, 174, 145)),
                           tmp_path / name)  # fmt: skip
    if bad is not None:
        with zipfile.ZipFile(path) as zf:
            info = next(i for i in zf.infolist() if i.filename.startswith("positions"))
            start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        with open(path, "r+b") as handle:  # point 1234's x, in place
            handle.seek(start + 1234 * 3 * 4)
            handle.write(np.float32(bad).tobytes())
    return path


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_bad_trx_opened_unchecked_is_refused_later_with_the_same_message(tmp_path, bad):
    path = _trx(tmp_path, bad=bad)
    with pytest.raises(InputError) as at_open:
        load_tractogram(path)
    (layer,) = load_layers(path, check_positions=False)
    tract = layer.data
    assert tract.mapped is not None and check_pending(layer)
    assert tract.mapped.world.shape == (8000, 3)  # opened and drawable meanwhile
    with pytest.raises(InputError) as later:
        check_opened(layer)
    assert str(later.value) == str(at_open.value) and "NaN or infinite" in str(later.value)
    assert tract.mapped.checked and not tract.mapped.positions_fit()
    assert check_pending(layer)  # refused: still not drawn by the slice views until withdrawn
    with pytest.raises(ValueError, match="non-finite"):  # a conversion never hands out the bad point
        tract.points_rows(1200, 1300)
    assert tract.points_rows(0, 1000).shape == (1000, 3)  # (rows without it are fine)


def test_a_session_copy_of_an_unchecked_trx_runs_the_check_first(tmp_path):
    tract = load_tractogram(_trx(tmp_path, bad=np.nan), check_positions=False)
    target = tmp_path / "autosave" / "layer.trx"
    with pytest.raises(InputError, match="NaN or infinite"):
        save_tractogram_exact(tract, target)
    assert not target.parent.exists() or not any(target.parent.iterdir())  # nothing written, no temporary
    good = load_tractogram(_trx(tmp_path, "good.trx"), check_positions=False)
    save_tractogram_exact(good, target)
    assert good.mapped.checked and good.mapped.positions_fit()
    np.testing.assert_array_equal(load_tractogram(target, grid=(good.affine, good.dimensions)).points, good.points)


def test_a_sound_trx_is_checked_once_whoever_asks(tmp_path, monkeypatch):
    calls = []
    real = tractogram_io.points_fit_grid
    monkeypatch.setattr(tractogram_io, "points_fit_grid", lambda *a: calls.append(1) or real(*a))
    path = _trx(tmp_path)
    load_tractogram(path)
    assert calls == [1]  # checked at open by default (the CLI, batch, sessions)
    (layer,) = load_layers(path, check_positions=False)
    assert calls == [1] and check_pending(layer)
    threads = [threading.Thread(target=check_opened, args=(layer,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    check_opened(layer)
    assert calls == [1, 1] and not check_pending(layer)


def test_a_pickled_unchecked_tractogram_carries_the_check(tmp_path):
    import pickle

    good = load_tractogram(_trx(tmp_path), check_positions=False)
    bad = load_tractogram(_trx(tmp_path, "bad.trx", bad=np.nan), check_positions=False)
    assert pickle.loads(pickle.dumps(good)).mapped.positions_fit() and good.mapped.checked
    twin = pickle.loads(pickle.dumps(bad))
    assert not twin.mapped.positions_fit()


def test_withdrawing_a_refused_layer_leaves_the_document_as_it_was(tmp_path):
    path = _trx(tmp_path, bad=np.nan)
    empty = Document()
    (layer,) = load_layers(path, check_positions=False)
    empty.add_layer(layer)
    assert empty.reference_affine is not None  # given by the tractogram's grid
    withdraw_opened(empty, layer, None)
    assert empty.layers == [] and empty.reference_affine is None and empty.reference_shape is None
    # a document that had a grid keeps it, and its layers
    doc = Document()
    image = Layer("t1", Volume("t1", np.zeros((10, 12, 14), np.float32), np.diag([2.0, 2.0, 2.0, 1.0])), "scalar")
    doc.add_layer(image)
    before = doc.reference_affine.copy()
    (layer,) = load_layers(path, check_positions=False)
    doc.add_layer(layer)
    withdraw_opened(doc, layer, before)
    assert doc.layers == [image]
    np.testing.assert_array_equal(doc.reference_affine, before)
    withdraw_opened(doc, layer, before)  # already out (the user removed it): nothing happens
    assert doc.layers == [image]
