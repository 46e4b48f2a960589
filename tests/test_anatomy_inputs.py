"""What users give the anatomy commands by mistake: each refused with the file and a fix, before any
work, and nothing of theirs lost (an output folder of other files is never replaced)."""

from __future__ import annotations

import os

import nibabel as nib
import numpy as np
import pytest

from tests.anatomy_synth import grid, image_on, rigid
from tractlens.app import anatomy as use_cases
from tractlens.app.cli import main
from tractlens.app.errors import InputError
from tractlens.app.params import RegisterParams

FAST = RegisterParams(type="rigid", spacing_mm=4.0, sampling=1.0, affine_iterations=(40, 20))


def _save(path, data, affine):
    nib.save(nib.Nifti1Image(np.asarray(data), affine), path)
    return str(path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A small head and the same head turned 4° and moved 3 mm, and their registration folder."""
    d = tmp_path_factory.mktemp("pair")
    g = grid((30, 34, 28), 4.0)
    fixed = _save(d / "fixed.nii.gz", image_on(g), g.affine)
    moving = _save(d / "moving.nii.gz", image_on(g, rigid(0, 0, 4, (3.0, 0, 0))), g.affine)
    use_cases.register_images(moving, fixed, d / "reg", FAST, device="cpu")
    return d, g


def test_register_into_a_folder_of_other_files_is_refused_and_deletes_nothing(pair, tmp_path, capsys):
    """It replaced the folder whole: the subject's images in it were deleted."""
    d, _g = pair
    subject = tmp_path / "subject"
    subject.mkdir()
    for name in ("moving.nii.gz", "fixed.nii.gz"):
        (subject / name).write_bytes((d / name).read_bytes())
    (subject / "notes.txt").write_text("mine")
    before = sorted(os.listdir(subject))
    code = main(["register", str(subject / "moving.nii.gz"), str(subject / "fixed.nii.gz"), "-o", str(subject),
                 "--type", "rigid", "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "holds other files" in err and "new or empty folder" in err
    assert sorted(os.listdir(subject)) == before


def test_an_earlier_registration_is_replaced_but_not_when_it_holds_an_input(pair, tmp_path):
    d, _g = pair
    out = tmp_path / "reg"
    use_cases.register_images(str(d / "moving.nii.gz"), str(d / "fixed.nii.gz"), out, FAST, device="cpu")
    first = (out / "registration.json").stat().st_mtime_ns
    use_cases.register_images(str(d / "moving.nii.gz"), str(d / "fixed.nii.gz"), out, FAST, device="cpu")
    assert (out / "registration.json").stat().st_mtime_ns != first  # replaced: an earlier output
    resampled = out / "moving_in_fixed.nii.gz"  # its own output, given as an input of the next run
    with pytest.raises(InputError, match=r"is or holds the input moving_in_fixed\.nii\.gz"):
        use_cases.register_images(str(resampled), str(d / "fixed.nii.gz"), out, FAST, device="cpu")
    assert resampled.exists()
    (out / "notes.txt").write_text("mine")  # a file the registration did not write
    with pytest.raises(InputError, match=r"did not write \(notes\.txt\)"):
        use_cases.register_images(str(d / "moving.nii.gz"), str(d / "fixed.nii.gz"), out, FAST, device="cpu")
    assert (out / "notes.txt").read_text() == "mine"


def test_a_4d_fixed_image_takes_its_own_volume_option(pair, tmp_path, capsys):
    d, g = pair
    four = np.stack([image_on(g)] * 3, axis=-1)
    _save(tmp_path / "fixed4.nii.gz", four, g.affine)
    argv = ["register", str(d / "moving.nii.gz"), str(tmp_path / "fixed4.nii.gz"), "-o", str(tmp_path / "r"),
            "--type", "rigid", "--spacing", "4", "--device", "cpu", "--quiet"]  # fmt: skip
    assert main(argv) == 2 and "--fixed-volume N" in capsys.readouterr().err
    assert main([*argv, "--fixed-volume", "5"]) == 2 and "--fixed-volume 5 is outside" in capsys.readouterr().err
    assert main([*argv, "--fixed-volume", "1"]) == 0
    assert (tmp_path / "r" / "registration.json").is_file()


@pytest.mark.parametrize("where", ["moving", "fixed-mask", "reference", "atlas-reference"])
def test_a_2d_image_is_named_not_an_internal_error(pair, tmp_path, capsys, where):
    d, g = pair
    flat = _save(tmp_path / "slice.nii.gz", image_on(g)[:, :, 10], g.affine)
    if where == "moving":
        argv = ["register", flat, str(d / "fixed.nii.gz"), "-o", str(tmp_path / "r")]
    elif where == "fixed-mask":
        argv = ["register", str(d / "moving.nii.gz"), str(d / "fixed.nii.gz"), "-o", str(tmp_path / "r"),
                "--fixed-mask", flat]  # fmt: skip
    elif where == "reference":
        argv = ["apply-transform", str(d / "moving.nii.gz"), "--registration", str(d / "reg"), "--reference", flat,
                "-o", str(tmp_path / "o.nii.gz")]  # fmt: skip
    else:
        argv = ["atlas", "aal", "--registration", str(d / "reg"), "--reference", flat, "-o", str(tmp_path / "a.nii.gz")]
    code = main([*argv, "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "internal error" not in err and "slice.nii.gz" in err, err
    assert not (tmp_path / "r").exists() and not (tmp_path / "o.nii.gz").exists()


def test_a_4d_mask_file_is_refused_with_the_reason(pair, tmp_path, capsys):
    d, g = pair
    mask4 = _save(tmp_path / "mask4.nii.gz", np.ones((*g.shape, 2), np.uint8), g.affine)
    code = main(["register", str(d / "moving.nii.gz"), str(d / "fixed.nii.gz"), "-o", str(tmp_path / "r"),
                 "--moving-mask", mask4, "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "mask4.nii.gz" in err and "a mask is 3-D" in err


@pytest.mark.parametrize("name", ["out.trk", "out", "out.txt", "pair.img", "pair.hdr"])
def test_an_image_output_that_is_not_nifti_is_refused_before_the_work(pair, tmp_path, capsys, name):
    d, _g = pair
    code = main(["apply-transform", str(d / "moving.nii.gz"), "--registration", str(d / "reg"), "--reference",
                 str(d / "fixed.nii.gz"), "-o", str(tmp_path / name), "--device", "cpu"])  # fmt: skip
    assert code == 2 and "must end in .nii.gz or .nii" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []  # not the named file, nor a hidden half of a pair


def test_labels_stored_as_float_are_moved_by_nearest_neighbour(pair, tmp_path):
    d, g = pair
    labels = np.zeros(g.shape, np.float32)
    labels[8:16, 10:20, 8:16] = 7
    labels[16:22, 12:22, 10:18] = 3
    _save(tmp_path / "regions.nii.gz", labels, g.affine)
    summary = use_cases.apply_transform(str(tmp_path / "regions.nii.gz"), d / "reg", str(d / "fixed.nii.gz"),
                                        tmp_path / "moved.nii.gz", device="cpu")  # fmt: skip
    assert summary["interpolation"] == "nearest" and summary["kind"] == "labels"
    assert set(np.unique(nib.load(tmp_path / "moved.nii.gz").get_fdata())) <= {0.0, 3.0, 7.0}
    image = use_cases.apply_transform(str(d / "moving.nii.gz"), d / "reg", str(d / "fixed.nii.gz"),
                                      tmp_path / "image.nii.gz", device="cpu")  # fmt: skip
    assert image["interpolation"] == "linear"  # an intensity image stays linear


@pytest.mark.parametrize("text", ["hello world\n", "1 0 0\n0 1 0\n", "1 0 0 0\n0 1 0 0\n0 0 1 0\n5 5 5 5\n"])
def test_a_text_file_that_is_no_transform_is_not_called_a_flirt_matrix(pair, tmp_path, capsys, text):
    d, _g = pair
    (tmp_path / "notes.txt").write_text(text)
    code = main(["apply-transform", str(d / "moving.nii.gz"), "--transform", str(tmp_path / "notes.txt"),
                 "--reference", str(d / "fixed.nii.gz"), "-o", str(tmp_path / "o.nii.gz")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "neither an ITK/ANTs transform nor an FSL FLIRT matrix" in err and "--flirt-ref" not in err


def test_the_input_is_not_overwritten_by_its_own_output(pair, tmp_path, capsys):
    d, _g = pair
    source = tmp_path / "t1.nii.gz"
    source.write_bytes((d / "moving.nii.gz").read_bytes())
    before = source.read_bytes()
    code = main(["apply-transform", str(source), "--registration", str(d / "reg"), "--reference",
                 str(d / "fixed.nii.gz"), "-o", str(source), "--device", "cpu"])  # fmt: skip
    assert code == 2 and "is also an input of this command" in capsys.readouterr().err  # the command line's check
    with pytest.raises(InputError, match="is the input itself"):  # and the use case's, for Python callers
        use_cases.apply_transform(str(source), d / "reg", str(d / "fixed.nii.gz"), source, device="cpu")
    assert source.read_bytes() == before
