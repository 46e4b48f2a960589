"""app.layer_files: the use case behind a layer's "Save as…" (formats, refusals, nothing half written)."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.layer_files import default_file_name, layer_file_path, save_layer, save_suffixes
from tractlens.app.model import Layer, Tractogram, Volume

AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


def _tract_layer() -> Layer:
    tract = Tractogram.from_list([np.array([[1.0, 1, 1], [2, 2, 2], [3, 3, 2]])], affine=AFFINE, dimensions=(8, 8, 8))
    return Layer("my bundle", tract, "tractogram")


def test_each_kind_offers_its_formats_and_a_file_name():
    assert save_suffixes(_tract_layer()) == (".trk", ".tck", ".trx")
    scalar = Layer("FA", Volume("FA", np.zeros((4, 4, 4), np.float32), AFFINE), "scalar")
    assert save_suffixes(scalar) == (".nii.gz", ".nii")
    assert default_file_name(_tract_layer()) == "my_bundle.trk"
    assert layer_file_path(scalar, "/tmp/x").name == "x.nii.gz"
    assert layer_file_path(scalar, "/tmp/x.nii").name == "x.nii"


def test_a_wrong_suffix_or_a_kind_kept_only_in_sessions_is_refused_and_nothing_written(tmp_path):
    with pytest.raises(InputError, match=r"\.trk, \.tck, \.trx"):
        save_layer(_tract_layer(), tmp_path / "bundle.nii.gz")
    assert list(tmp_path.iterdir()) == []
    dwi = Layer("dwi", Volume("dwi", np.zeros((4, 4, 4, 7), np.float32), AFFINE, kind="dyads"), "dyads")
    with pytest.raises(InputError, match="Save session"):
        save_layer(dwi, tmp_path / "dyads.nii.gz")
    assert list(tmp_path.iterdir()) == []


def test_a_tractogram_is_written_with_its_suffix_added(tmp_path):
    written = save_layer(_tract_layer(), tmp_path / "bundle")
    assert written == tmp_path / "bundle.trk" and written.stat().st_size > 1000
