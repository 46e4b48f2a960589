"""Empty results are ordinary states (issue 22): a 0-streamline tractogram file reads back in
every format, tracking that keeps nothing says which filter emptied it, every command that reads
a tractogram answers an empty one with a clear message and its documented exit status (never a
traceback, never "inf"), and sessions keep an empty tractogram layer."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
from nibabel.streamlines import Field
from nibabel.streamlines import Tractogram as NibTractogram

from tractlens.app.cli import EXIT_INPUT, EXIT_OK, main
from tractlens.app.io.nifti import load_mask
from tractlens.app.io.tractogram import load_tractogram, save_tractogram
from tractlens.app.model import Document, Layer, Tractogram
from tractlens.app.session import load_session, save_session

FORMATS = [".trk", ".tck", ".trx"]
GRID = (np.diag([2.0, 2.0, 2.5, 1.0]) + np.array([[0, 0, 0, -10.0], [0, 0, 0, 4.0], [0, 0, 0, 0], [0, 0, 0, 0]]),
        (12, 10, 8))  # fmt: skip


def write_empty_with_the_library(path) -> None:
    """A 0-streamline file as nibabel (.trk, .tck) or trx-python (.trx) write it, not TractLens."""
    affine, dims = GRID
    if path.suffix == ".trx":
        from trx.trx_file_memmap import TrxFile
        from trx.trx_file_memmap import save as trx_save

        header = nib.Nifti1Header()
        header.set_data_shape(dims)
        header.set_sform(affine, code=1)
        trx = TrxFile.from_tractogram(NibTractogram([], affine_to_rasmm=np.eye(4)), reference=header)
        trx_save(trx, str(path))
        trx.close()
        return
    header = None
    if path.suffix == ".trk":
        header = {
            Field.VOXEL_TO_RASMM: affine,
            Field.DIMENSIONS: np.array(dims, np.int16),
            Field.VOXEL_SIZES: np.array([2.0, 2.0, 2.5], np.float32),
            Field.VOXEL_ORDER: "RAS",
        }
    nib.streamlines.save(NibTractogram([], affine_to_rasmm=np.eye(4)), str(path), header=header)
    assert len(nib.streamlines.load(str(path)).streamlines) == 0  # nibabel reads it


def empty_tractogram(with_scalars: bool = True) -> Tractogram:
    affine, dims = GRID
    scalars = ({"fa": np.zeros(0, np.float32)}, {"length_mm": np.zeros(0, np.float32)}) if with_scalars else ({}, {})
    return Tractogram(np.zeros((0, 3)), np.zeros(1, np.int64), affine, dims, *scalars, name="nothing")


# --------------------------------------------------------------------------- reading
@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("writer", ["library", "tractlens"])
def test_a_zero_streamline_file_reads_back_as_an_empty_tractogram(tmp_path, suffix, writer):
    path = tmp_path / f"empty{suffix}"
    if writer == "library":
        write_empty_with_the_library(path)
    else:
        save_tractogram(empty_tractogram(with_scalars=suffix != ".tck"), path)
    tract = load_tractogram(path, reference=GRID)
    assert len(tract) == 0 and tract.points.shape == (0, 3)
    np.testing.assert_array_equal(tract.offsets, [0])
    if suffix != ".tck":  # .trk and .trx carry their grid
        assert tract.dimensions == GRID[1]
        np.testing.assert_allclose(tract.affine, GRID[0], atol=1e-5)


def test_a_truncated_trk_is_still_refused(tmp_path):
    """The empty case must not open the door to damaged files: a header announcing streamlines
    the file does not hold stays an error."""
    from tractlens.app.errors import InputError

    path = tmp_path / "cut.trk"
    write_empty_with_the_library(path)
    raw = bytearray(path.read_bytes())
    raw[988:992] = np.int32(3).tobytes()  # n_count: 3 streamlines in a header-only file
    path.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=r"cannot hold|truncated"):
        load_tractogram(path)


# --------------------------------------------------------------------------- sessions
def test_a_session_keeps_an_empty_tractogram_layer(tmp_path):
    doc = Document()
    layer = doc.add_layer(Layer("deterministic", empty_tractogram(), "tractogram"))
    layer.set_selection(np.zeros(0, bool))
    reopened = load_session(save_session(doc, tmp_path / "empty")).document.layer("deterministic")
    assert len(reopened.data) == 0 and reopened.data.points.shape == (0, 3)
    assert set(reopened.data.point_scalars) == {"fa"} and set(reopened.data.streamline_scalars) == {"length_mm"}
    assert reopened.selection is not None and reopened.selection.shape == (0,)
    np.testing.assert_array_equal(reopened.data.affine, GRID[0])


def test_an_empty_tractogram_layer_is_a_consistent_document():
    from tractlens.app.integrity import document_problems

    doc = Document()
    layer = doc.add_layer(Layer("nothing", empty_tractogram(), "tractogram"))
    layer.set_selection(np.zeros(0, bool))
    assert document_problems(doc) == []
    np.testing.assert_array_equal(layer.point_values("fa"), np.zeros(0))  # the display's per-point values
    np.testing.assert_array_equal(layer.point_values("length_mm"), np.zeros(0))


# --------------------------------------------------------------------------- tracking
@pytest.fixture(scope="module")
def demo_field(demo_dir):
    from tractlens.app.pipelines.track import load_tensor_field

    return load_tensor_field(dwi=demo_dir / "dwi.nii.gz", device="cpu")


def _mask(demo_dir, name):
    return load_mask(demo_dir / f"{name}.nii.gz")


@pytest.mark.parametrize(
    "case, expected",
    [
        ("target nothing reaches", "reached the target region"),
        ("minimum length above the maximum reached", "shorter than the minimum length"),
        ("FA threshold above every FA", "none left the seed"),
        ("exclusion over the seed", "entered an exclusion region"),
    ],
)
def test_an_empty_deterministic_result_names_the_filter_that_emptied_it(demo_field, demo_dir, case, expected):
    from tractlens.app.pipelines.track import DeterministicParams, deterministic_pipeline

    seed = _mask(demo_dir, "roi_crossing_lr_seed")
    options, params = {}, DeterministicParams()
    if case == "target nothing reaches":  # issue 22's demo case, default settings
        options["include"] = [_mask(demo_dir, "roi_crossing_lr_target")]
    elif case.startswith("minimum length"):
        params = DeterministicParams(min_length_mm=400.0, max_length_mm=500.0)
    elif case.startswith("FA threshold"):
        params = DeterministicParams(fa_threshold=0.99)
    else:
        options["exclude"] = [seed]
    result = deterministic_pipeline(demo_field, seed_mask=seed, params=params, device="cpu", **options)
    assert len(result.tractogram) == 0
    reason = result.provenance["empty_reason"]
    assert expected in reason, reason
    assert f"0 streamlines: {reason}" in result.notes
    if case == "target nothing reaches":
        assert "minimum length" not in reason


def test_a_non_empty_result_has_no_empty_reason(demo_field, demo_dir):
    from tractlens.app.pipelines.track import deterministic_pipeline

    result = deterministic_pipeline(demo_field, seed_mask=_mask(demo_dir, "roi_crossing_lr_seed"), device="cpu")
    assert len(result.tractogram) > 0 and "empty_reason" not in result.provenance
    assert not any(note.startswith("0 streamlines") for note in result.notes)


def test_geodesic_tracking_to_a_target_nothing_reaches_says_so(demo_field, demo_dir):
    from tractlens.app.pipelines.track import geodesic_pipeline

    seed = _mask(demo_dir, "roi_crossing_lr_seed")
    target = np.zeros_like(seed)
    target[0, 0, 0] = True  # a corner outside the fitted voxels: no fibre gets there
    result = geodesic_pipeline(demo_field, seed_mask=seed, target=target, directions=8, device="cpu", method="rays")
    assert len(result.tractogram) == 0 and result.provenance["reached_target"] == 0
    assert "reached the target region" in result.provenance["empty_reason"]


def test_the_track_command_blames_the_real_cause(demo_dir, tmp_path, capsys, caplog):
    code = main([
        "track", "deterministic", "--dwi", str(demo_dir / "dwi.nii.gz"), "--device", "cpu", "--quiet",
        "--seed", str(demo_dir / "roi_crossing_lr_seed.nii.gz"),
        "--include", str(demo_dir / "roi_crossing_lr_target.nii.gz"),
        "-o", str(tmp_path / "none.trk"),
    ])  # fmt: skip
    err = capsys.readouterr().err + caplog.text  # warnings: stderr, or pytest's log capture
    assert code == EXIT_OK
    assert "0 streamlines: none of the" in err and "reached the target region" in err
    assert "--min-length" not in err
    assert len(load_tractogram(tmp_path / "none.trk")) == 0  # the file it wrote reads back


# --------------------------------------------------------------------------- commands
COMMANDS = {
    # command: (arguments after the tractogram, exit status, what stdout or stderr must say)
    "select": (["--include", "{d}/roi_crossing_lr_target.nii.gz", "-o", "{t}/out{s}"], EXIT_OK, "holds no streamlines"),
    "distance": (["--lesion", "{d}/lesion.nii.gz", "-o", "{t}/out{s}"], EXIT_OK, "0 streamlines: none within"),
    "profile": (["--map", "{d}/labels.nii.gz", "-o", "{t}/profile.csv"], EXIT_INPUT, "0 streamlines"),
    "connectome": (["--labels", "{d}/parcellation.nii.gz", "-o", "{t}/matrix.csv"], EXIT_INPUT, "0 streamlines"),
    "commit": (["--dwi", "{d}/dwi.nii.gz", "-o", "{t}/commit"], EXIT_INPUT, "0 streamlines"),
}


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_that_reads_a_tractogram_answers_an_empty_one(demo_dir, tmp_path, capsys, command, suffix):
    from tractlens.app.io import load_volume

    reference = load_volume(demo_dir / "lesion.nii.gz")
    empty = Tractogram(np.zeros((0, 3)), np.zeros(1, np.int64), reference.affine, reference.shape3, name="none")
    path = tmp_path / f"none{suffix}"
    save_tractogram(empty, path)
    rest, expected_code, expected_text = COMMANDS[command]
    rest = [a.format(d=demo_dir, t=tmp_path, s=".trk" if suffix == ".tck" else suffix) for a in rest]
    tract_args = ["--tractogram", str(path)] if command == "commit" else [str(path)]
    code = main([command, *tract_args, *rest, "--device", "cpu", "--quiet", "--json"])
    out, err = capsys.readouterr()
    assert code == expected_code, err
    assert "Traceback" not in err and "inf" not in out.lower()
    if code == EXIT_OK:
        summary = json.loads(out)  # valid JSON: no Infinity
        assert summary["streamlines"] == 0
        assert len(load_tractogram(tmp_path / f"out{'.trk' if suffix == '.tck' else suffix}")) == 0
        main([command, *tract_args, *rest, "--device", "cpu", "--quiet"])
        assert expected_text in capsys.readouterr().out
    else:
        assert expected_text in err and str(path.name) in err
