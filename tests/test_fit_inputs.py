"""Inputs of the fits and the presurgical distance that users get wrong: refused with the reason
in the user's own terms (units included), never an internal error."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tractlens.app.cli import main


@pytest.fixture
def ms_um2(demo_dir, tmp_path):
    """The demo series with its b-values written in ms/µm² (1000 s/mm² = 1)."""
    for ext in ("nii.gz", "bvec"):
        shutil.copy(demo_dir / f"dwi.{ext}", tmp_path / f"dwi.{ext}")
    bvals = np.loadtxt(demo_dir / "dwi.bval")
    np.savetxt(tmp_path / "dwi.bval", bvals[None] / 1000.0, fmt="%g")
    return tmp_path / "dwi.nii.gz"


@pytest.mark.parametrize("command", ["fit-dti", "fit-csd", "fit-ballstick", "fit-model"])
def test_b_values_in_ms_per_um2_are_named_as_such(ms_um2, tmp_path, capsys, command):
    argv = [command, *(["noddi-watson"] if command == "fit-model" else []), str(ms_um2), "-o", str(tmp_path / "out"),
            "--device", "cpu"]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "dwi.bval" in err and "looks like ms/µm²" in err and "multiply the b-values by 1000" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_negative_safety_margin_is_refused(demo_dir, tmp_path, capsys):
    code = main(["distance", str(demo_dir / "bundles.trk"), "--lesion", str(demo_dir / "lesion.nii.gz"),
                 "--margin", "-3", "-o", str(tmp_path / "d.csv")])  # fmt: skip
    assert code == 2 and "--margin must be a positive distance in mm, got -3" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["fit-dti", "fit-ballstick", "fit-model"])
def test_a_series_without_signal_in_the_mask_is_refused_not_reported_fitted(demo_dir, tmp_path, capsys, command):
    """It was "fitted N voxels", exit 0, every map empty."""
    import nibabel as nib

    img = nib.load(demo_dir / "dwi.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros(img.shape, np.float32), img.affine), tmp_path / "zeros.nii.gz")
    for ext in ("bval", "bvec"):
        shutil.copy(demo_dir / f"dwi.{ext}", tmp_path / f"zeros.{ext}")
    argv = [command, *(["noddi-watson"] if command == "fit-model" else []), str(tmp_path / "zeros.nii.gz"),
            "--mask", str(demo_dir / "mask.nii.gz"), "-o", str(tmp_path / "out"), "--device", "cpu"]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "could be fitted" in err and "zeros.nii.gz" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.fixture
def shifted(demo_dir, tmp_path):
    """The demo bundles and seed ROI moved 500 mm away: another space than the maps and labels."""
    import nibabel as nib
    from nibabel.streamlines import Field, Tractogram, TrkFile

    t = nib.streamlines.load(demo_dir / "bundles.trk")
    header = t.header.copy()
    affine = header[Field.VOXEL_TO_RASMM].copy()
    affine[:3, 3] += 500
    header[Field.VOXEL_TO_RASMM] = affine
    TrkFile(Tractogram([s + 500 for s in t.streamlines], affine_to_rasmm=np.eye(4)), header=header).save(
        str(tmp_path / "shifted.trk")
    )
    roi = nib.load(demo_dir / "roi_arc_seed.nii.gz")
    nib.save(nib.Nifti1Image(np.asarray(roi.dataobj), affine), tmp_path / "roi_shifted.nii.gz")
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["stats", "{t}/shifted.trk", "--map", "{d}/mask.nii.gz", "-o", "{t}/s.csv"], "tractogram lies wholly outside"),
        (
            ["stats", "--roi", "{t}/roi_shifted.nii.gz", "--map", "{d}/mask.nii.gz", "-o", "{t}/s.csv"],
            "ROI roi_shifted",
        ),
        (["connectome", "{t}/shifted.trk", "--labels", "{d}/parcellation.nii.gz", "-o", "{t}/c.csv"], "wholly outside"),
    ],
)
def test_inputs_of_another_space_are_refused_not_given_blank_results(shifted, demo_dir, capsys, argv, expect):
    """Exit 0 with empty statistics or an all-zero matrix, and no word, before."""
    words = [w.format(t=shifted, d=demo_dir) for w in argv]
    assert main(words) == 2
    err = capsys.readouterr().err
    assert expect in err and "same space" in err
    assert not (shifted / "s.csv").exists() and not (shifted / "c.csv").exists()


def test_small_messages_name_their_file(demo_dir, tmp_path, capsys):
    """An all-zero labels image and the envelopes of an empty tractogram named no file."""
    import nibabel as nib
    from nibabel.streamlines import Tractogram, TrkFile

    labels = nib.load(demo_dir / "parcellation.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros(labels.shape, np.int16), labels.affine), tmp_path / "zero_labels.nii.gz")
    assert main(["connectome", str(demo_dir / "bundles.trk"), "--labels", str(tmp_path / "zero_labels.nii.gz"),
                 "-o", str(tmp_path / "c.csv")]) == 2  # fmt: skip
    assert "zero_labels.nii.gz: the label volume has no region" in capsys.readouterr().err
    header = nib.streamlines.load(demo_dir / "bundles.trk").header
    TrkFile(Tractogram([], affine_to_rasmm=np.eye(4)), header=header).save(str(tmp_path / "empty.trk"))
    assert main(["envelopes", str(tmp_path / "empty.trk"), "-o", str(tmp_path / "env")]) == 2
    err = capsys.readouterr().err
    assert "empty.trk: the tractogram holds 0 streamlines" in err and "waytotal" not in err
