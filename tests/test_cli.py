"""The tractlens command: outputs, JSON, and clean errors with the documented exit codes."""

import json
import os
import re
import shutil
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

from tests.conftest import installed_tool
from tractlens.app.cli import main


def run_cli(*args, env=None):
    """Run the real console entry point in a fresh interpreter."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


def test_info_reports_backend_as_json():
    out = run_cli("info", "--json", env={"TRACTLENS_DISABLE_GPU": "1"})
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["backend"] == "cpu" and info["gpu_available"] is False
    assert "TRACTLENS_DISABLE_GPU" in info["gpu_unavailable_reason"]


@pytest.fixture(scope="module")
def fitted(demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fit") / "dti"
    result = run_cli("fit-dti", str(demo_dir / "dwi.nii.gz"), "-o", str(out), "--json", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    return out, json.loads(result.stdout), result.stderr


def test_fit_dti_writes_every_documented_map(fitted):
    out, summary, stderr = fitted
    expected = {"FA", "MD", "AD", "RD", "RGB", "tensor", "V1", "L1", "L2", "L3", "mask"}
    assert {f"dti_{name}" for name in expected} <= {f.split(".")[0] for f in summary["files"]}
    shapes = {name: nib.load(out / f"dti_{name}.nii.gz").shape for name in expected}
    assert shapes["FA"] == (56, 56, 24) and shapes["tensor"] == (56, 56, 24, 6)
    assert shapes["RGB"] == shapes["V1"] == (56, 56, 24, 3)
    assert summary["backend"] == "cpu" and summary["voxels_fitted"] > 30_000
    assert "fit-dti: 100.0%" in stderr  # progress went to stderr
    assert not list(out.glob(".*tmp*"))  # no temporary files left behind


def test_fit_dti_files_match_dipy_in_fsl_conventions(fitted, demo_dir):
    """FA/MD equal DIPY's; tensor.nii.gz is FSL order and V1 is in the bvec file's frame,
    so they equal DIPY's fit of the same files (DIPY keeps the bvec frame)."""
    from dipy.core.gradients import gradient_table
    from dipy.io.gradients import read_bvals_bvecs
    from dipy.reconst.dti import TensorModel

    out, _, _ = fitted
    data = nib.load(demo_dir / "dwi.nii.gz").get_fdata()
    bvals, bvecs = read_bvals_bvecs(str(demo_dir / "dwi.bval"), str(demo_dir / "dwi.bvec"))
    mask = nib.load(out / "dti_mask.nii.gz").get_fdata() > 0
    ref = TensorModel(gradient_table(bvals, bvecs=bvecs)).fit(data, mask=mask)
    fa = nib.load(out / "dti_FA.nii.gz").get_fdata()
    assert np.abs(fa - ref.fa)[mask].max() < 1e-4  # float32 files
    lower = ref.lower_triangular()[mask]  # DIPY: xx, xy, yy, xz, yz, zz
    tensor = nib.load(out / "dti_tensor.nii.gz").get_fdata()[mask]  # FSL: xx, xy, xz, yy, yz, zz
    np.testing.assert_allclose(tensor, lower[:, [0, 1, 3, 2, 4, 5]], atol=1e-8)
    v1 = nib.load(out / "dti_V1.nii.gz").get_fdata()[mask]
    aniso = ref.fa[mask] > 0.3
    cos = np.abs((v1 * ref.evecs[mask][:, :, 0]).sum(-1))[aniso]
    assert np.percentile(cos, 1) > 0.999


def _expect_input_error(*args, match, env=None):
    out = run_cli(*args, env=env)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    assert match in out.stderr, out.stderr
    return out


def test_bad_inputs_exit_2_with_one_paragraph(tmp_path, demo_dir):
    dwi = str(demo_dir / "dwi.nii.gz")
    _expect_input_error(
        "fit-dti",
        str(demo_dir / "mask.nii.gz"),
        "--bval",
        str(demo_dir / "dwi.bval"),
        "--bvec",
        str(demo_dir / "dwi.bvec"),
        "-o",
        str(tmp_path / "o"),
        match="single 3-D volume",
    )
    np.savetxt(tmp_path / "bad.bval", np.zeros((1, 10)))
    _expect_input_error(
        "fit-dti",
        dwi,
        "--bval",
        str(tmp_path / "bad.bval"),
        "-o",
        str(tmp_path / "o"),
        match="10 b-values for 68 volumes",
    )
    _expect_input_error("fit-dti", str(tmp_path / "missing.nii.gz"), "-o", str(tmp_path / "o"), match="not found")
    _expect_input_error(
        "fit-dti", dwi, "--mask", str(demo_dir / "demo.json"), "-o", str(tmp_path / "o"), match="not a NIfTI file"
    )
    _expect_input_error(
        "fit-dti",
        dwi,
        "--device",
        "gpu",
        "-o",
        str(tmp_path / "o"),
        env={"TRACTLENS_DISABLE_GPU": "1"},
        match="a GPU was requested but none can be used",
    )
    assert not (tmp_path / "o").exists()  # nothing written on failure


def test_too_few_directions_is_an_input_error(tmp_path, demo_dir):
    keep = list(range(4)) + list(range(4, 9))  # 4 b=0 + 5 directions: no tensor
    img = nib.load(demo_dir / "dwi.nii.gz")
    nib.save(nib.Nifti1Image(img.get_fdata()[..., keep].astype(np.int16), img.affine), tmp_path / "few.nii.gz")
    np.savetxt(tmp_path / "few.bval", np.loadtxt(demo_dir / "dwi.bval")[None, keep], fmt="%g")
    np.savetxt(tmp_path / "few.bvec", np.loadtxt(demo_dir / "dwi.bvec")[:, keep])
    _expect_input_error("fit-dti", str(tmp_path / "few.nii.gz"), "-o", str(tmp_path / "o"), match="rank 6 < 7")


def test_demo_data_command(tmp_path):
    assert main(["demo-data", str(tmp_path / "demo"), "--quiet"]) == 0
    assert (tmp_path / "demo" / "dwi.nii.gz").exists() and (tmp_path / "demo" / "demo.json").exists()


def test_no_subcommand_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "fit-dti" in capsys.readouterr().err


def test_console_script_is_installed():
    exe = installed_tool("tractlens")
    assert exe, "pip install -e . should put 'tractlens' on PATH"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("tractlens ")


def test_select_keeps_exactly_the_bundle_between_its_rois(demo_dir, tmp_path):
    from tractlens.app.io import load_tractogram

    out = tmp_path / "arc.trx"
    result = run_cli(
        "select",
        str(demo_dir / "bundles.trk"),
        "--include",
        str(demo_dir / "roi_arc_seed.nii.gz"),
        "--include",
        str(demo_dir / "roi_arc_target.nii.gz"),
        "-o",
        str(out),
        "--json",
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    truth = load_tractogram(demo_dir / "bundles.trk")
    n_arc = int((truth.streamline_scalars["bundle"] == 3).sum())
    assert summary["selected"] == n_arc and summary["streamlines"] == len(truth)
    kept = load_tractogram(out)
    assert len(kept) == n_arc and set(kept.streamline_scalars["bundle"]) == {3.0}
    excluded = run_cli(
        "select",
        str(demo_dir / "bundles.trk"),
        "--include",
        str(demo_dir / "roi_arc_seed.nii.gz"),
        "--exclude",
        str(demo_dir / "roi_arc_target.nii.gz"),
        "-o",
        str(tmp_path / "none.tck"),
        "--json",
        "--device",
        "cpu",
    )
    assert excluded.returncode == 0 and json.loads(excluded.stdout)["selected"] == 0


def test_select_bad_inputs(demo_dir, tmp_path):
    nib.save(nib.Nifti1Image(np.zeros((56, 56, 24), np.uint8), np.eye(4)), tmp_path / "empty.nii.gz")
    _expect_input_error(
        "select",
        str(demo_dir / "bundles.trk"),
        "-o",
        str(tmp_path / "o.trk"),
        match="the following arguments are required: --include",
    )
    _expect_input_error(
        "select",
        str(demo_dir / "bundles.trk"),
        "--include",
        str(tmp_path / "empty.nii.gz"),
        "-o",
        str(tmp_path / "o.trk"),
        match="empty",
    )
    _expect_input_error(
        "select",
        str(demo_dir / "dwi.bval"),
        "--include",
        str(demo_dir / "mask.nii.gz"),
        "-o",
        str(tmp_path / "o.trk"),
        match="unknown tractogram format",
    )


def test_track_deterministic_from_fitted_tensors_and_from_the_dwi(fitted, demo_dir, tmp_path):
    """The same seeds from a tensor folder and from the DWI give the same streamlines; the
    file holds them in RAS mm with FA per point and length per streamline."""
    from tractlens.app.io import load_tractogram

    tensor_dir, _summary, _stderr = fitted
    common = ["--seed", str(demo_dir / "roi_arc_seed.nii.gz"), "--seeds-per-voxel", "2", "--min-length", "10"]
    common += ["--integrator", "rk4", "--device", "cpu", "--seed-rng", "5", "--json"]
    a = run_cli("track", "deterministic", "--tensor", str(tensor_dir), *common, "-o", str(tmp_path / "a.trk"))
    assert a.returncode == 0, a.stderr
    b = run_cli("track", "deterministic", "--dwi", str(demo_dir / "dwi.nii.gz"), *common, "-o", str(tmp_path / "b.trx"))
    assert b.returncode == 0, b.stderr
    summary = json.loads(a.stdout)
    assert summary["seeds"] == 80 and summary["streamlines"] >= 72
    assert summary["parameters"]["integrator"] == "rk4" and summary["rng_seed"] == 5
    assert sum(summary["stop_reasons"].values()) == 2 * summary["streamlines"]
    assert "track: 100.0%" in a.stderr
    ta = load_tractogram(tmp_path / "a.trk")
    tb = load_tractogram(tmp_path / "b.trx")
    assert len(ta) == len(tb) == summary["streamlines"]
    # FSL-order tensor files round-trip to float32: the streamlines agree to well under a voxel.
    np.testing.assert_allclose(ta.points_world(), tb.points_world(), atol=0.05)
    assert set(ta.point_scalars) >= {"fa"} and set(ta.streamline_scalars) >= {"length_mm"}
    assert ta.streamline_scalars["length_mm"].min() >= 10.0
    truth = load_tractogram(demo_dir / "bundles.trk")
    arc = truth.subset(truth.streamline_scalars["bundle"].astype(int).ravel() == 3)
    # Tracked points lie along the arc's ground-truth streamlines (bundle radius 5 mm; the
    # ends run a little past the bundle's ends, where FA fades in the partial volume).
    from scipy.spatial import cKDTree

    distance, _ = cKDTree(arc.points_world()).query(ta.points_world())
    assert np.median(distance) < 2.0 and np.percentile(distance, 90) < 4.0, np.percentile(distance, [50, 90])


def test_track_deterministic_whole_brain_and_roi_filters(demo_dir, tmp_path):
    out = tmp_path / "wb.tck"
    result = run_cli(
        "track", "deterministic", "--dwi", str(demo_dir / "dwi.nii.gz"), "--whole-brain",
        "--include", str(demo_dir / "roi_kissing_upper_seed.nii.gz"),
        "--include", str(demo_dir / "roi_kissing_upper_target.nii.gz"),
        "--device", "cpu", "--json", "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["seeding"] == "whole brain" and summary["seeds"] > 4000
    assert 0 < summary["streamlines"] < summary["streamlines_tracked"]
    assert summary["streamlines_removed_by_rois"] == summary["streamlines_tracked"] - summary["streamlines"]
    assert out.exists()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--seed", "EMPTY"], "empty"),
        (["--seed", "OUTSIDE"], "outside"),
        (["--seed", "SEED", "--fa-threshold", "1.5"], "FA threshold"),
        (["--seed", "SEED", "--seed-placement", "grid", "--seeds-per-voxel", "5"], "not a cube"),
        (["--seed", "SEED", "--bval", "x.bval"], "--bval"),
        (["--seed", "SEED", "-o", "out.vtk"], "unknown tractogram format"),
        (["--seed", "SEED", "-o", "missing/dir/out.trk"], "output folder does not exist"),
        (["--seed", "SEED", "--mask", "EMPTY"], "empty"),
    ],
)
def test_track_deterministic_bad_inputs(fitted, demo_dir, tmp_path, args, expect):
    tensor_dir = fitted[0]
    names = _bad_roi_files(demo_dir, tmp_path)
    args = [str(names.get(a, a)) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "t.trk")]
    else:
        args[args.index("-o") + 1] = str(tmp_path / args[args.index("-o") + 1])
    result = run_cli("track", "deterministic", "--tensor", str(tensor_dir), "--device", "cpu", *args)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert expect in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t.trk").exists()


def test_track_geodesic_keeps_ranked_fibres_that_reach_the_target(fitted, demo_dir, tmp_path):
    from tractlens.app.io import load_tractogram

    out = tmp_path / "geo.trx"
    result = run_cli(
        "track", "geodesic", "--tensor", str(fitted[0]), "--seed", str(demo_dir / "roi_arc_seed.nii.gz"),
        "--target", str(demo_dir / "roi_arc_target.nii.gz"), "--directions", "60", "--top-percent", "20",
        "--method", "rays", "--device", "cpu", "--json", "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["fibers"] == 40 * 60 and summary["reached_target"] > 50
    assert summary["streamlines"] == int(np.ceil(summary["reached_target"] * 0.2))
    assert summary["steps_per_s"] > 0 and summary["metric"]["repaired_voxels"] == 0
    tract = load_tractogram(out)
    cm = tract.streamline_scalars["cm"].ravel()
    assert len(tract) == summary["streamlines"] and np.all(np.diff(cm) <= 1e-6)
    assert len(tract.point_scalars["cm"]) == len(tract.points)


def test_track_geodesic_joins_every_seed_point_to_the_target_by_default(fitted, demo_dir, tmp_path):
    from tractlens.app.io import load_tractogram

    out = tmp_path / "geo.trk"
    result = run_cli(
        "track", "geodesic", "--tensor", str(fitted[0]), "--seed", str(demo_dir / "roi_arc_seed.nii.gz"),
        "--target", str(demo_dir / "roi_arc_target.nii.gz"), "--device", "cpu", "--json", "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["method"] == "geodesic eikonal" and summary["metric"]["metric"] == "adjugate"
    assert summary["seed_points_joined"] == summary["seed_points"] == summary["streamlines"] == 40
    tract = load_tractogram(out)
    assert len(tract) == 40 and np.all(np.diff(tract.streamline_scalars["cm"].ravel()) <= 1e-6)


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--top-percent", "0"], "top-percent"),
        (["--integrator", "rk2", "--step", "0"], "step must be positive"),
        (["--cone", "120"], "half-angle"),
        (["--sharpen-power", "0"], "power"),
    ],
)
def test_track_geodesic_bad_inputs(fitted, demo_dir, tmp_path, args, expect):
    result = run_cli(
        "track", "geodesic", "--tensor", str(fitted[0]), "--seed", str(demo_dir / "roi_arc_seed.nii.gz"),
        "--device", "cpu", "-o", str(tmp_path / "g.trk"), *args,
    )  # fmt: skip
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert expect in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "g.trk").exists()


def _bad_roi_files(demo_dir, tmp_path) -> dict:
    """An empty mask and one whose affine puts it 1 m away from the data, on the demo grid."""
    ref = nib.load(demo_dir / "roi_arc_seed.nii.gz")
    empty = tmp_path / "empty.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros(ref.shape, np.uint8), ref.affine), empty)
    outside = tmp_path / "outside.nii.gz"
    shifted = ref.affine.copy()
    shifted[:3, 3] += 1000.0
    nib.save(nib.Nifti1Image(np.ones(ref.shape, np.uint8), shifted), outside)
    return {"EMPTY": empty, "OUTSIDE": outside, "SEED": demo_dir / "roi_arc_seed.nii.gz"}


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--seed", "EMPTY"], "empty"),
        (["--seed", "OUTSIDE"], "outside"),
        (["--seed", "SEED", "--target", "OUTSIDE"], "outside"),
        (["--seed", "SEED", "--target", "EMPTY"], "empty"),
        (["--seed", "SEED", "--mask", "EMPTY"], "empty"),
    ],
)
def test_track_geodesic_bad_regions(fitted, demo_dir, tmp_path, args, expect):
    names = _bad_roi_files(demo_dir, tmp_path)
    args = [str(names.get(a, a)) for a in args]
    result = run_cli(
        "track", "geodesic", "--tensor", str(fitted[0]), "--device", "cpu", "-o", str(tmp_path / "g.trk"), *args
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert expect in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "g.trk").exists()


def test_track_geodesic_repairs_nan_and_non_positive_definite_tensors(fitted, demo_dir, tmp_path):
    """Broken voxels on the seed's way are replaced by the identity, counted and reported;
    tracking goes on."""
    import shutil

    folder = tmp_path / "dti"
    shutil.copytree(fitted[0], folder)
    tensor_img = nib.load(folder / "dti_tensor.nii.gz")
    tensor = np.asarray(tensor_img.dataobj, dtype=np.float32).copy()
    seed = np.argwhere(nib.load(demo_dir / "roi_arc_seed.nii.gz").get_fdata() > 0)
    broken = seed[:: max(1, len(seed) // 6)][:6]
    tensor[tuple(broken[:3].T)] = [1e-3, 0, 0, -1e-3, 0, 1e-3]  # FSL order: yy < 0, not positive definite
    tensor[tuple(broken[3:].T)] = np.nan
    nib.save(nib.Nifti1Image(tensor, tensor_img.affine, tensor_img.header), folder / "dti_tensor.nii.gz")
    result = run_cli(
        "track", "geodesic", "--tensor", str(folder), "--seed", str(demo_dir / "roi_arc_seed.nii.gz"),
        "--directions", "20", "--device", "cpu", "--json", "-o", str(tmp_path / "g.trk"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["metric"]["repaired_voxels"] == 3, summary["metric"]
    notes = " ".join(summary.get("notes", [])) + result.stderr
    assert "non-positive-definite" in notes and "NaN" in notes, notes
    assert summary["streamlines"] > 0 and (tmp_path / "g.trk").exists()


def _one_paragraph_error(*args, match, names):
    """Exit 2, stderr one line (no newline inside the message, no traceback) that names ``names``."""
    out = run_cli(*args, env={"TRACTLENS_DISABLE_GPU": "1"})
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    assert out.stderr.endswith("\n") and out.stderr.count("\n") == 1, out.stderr  # one paragraph, nothing else
    assert re.search(match, out.stderr), out.stderr
    assert str(names) in out.stderr, out.stderr
    return out


@pytest.fixture
def dwi_files(demo_dir, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("dwi.nii.gz", "dwi.bval", "dwi.bvec"):
        shutil.copy(demo_dir / name, folder / name)
    return folder


def test_bad_gradient_tables_exit_2_naming_the_file(dwi_files, tmp_path):
    dwi, bval, bvec = (dwi_files / n for n in ("dwi.nii.gz", "dwi.bval", "dwi.bvec"))
    out = str(tmp_path / "o")
    bvals, bvecs = np.loadtxt(bval), np.loadtxt(bvec)
    np.savetxt(tmp_path / "nob0.bval", np.maximum(bvals, 1000)[None], fmt="%g")
    _one_paragraph_error("fit-dti", str(dwi), "--bval", str(tmp_path / "nob0.bval"), "-o", out,
                         match=r"no b=0 volume.*threshold 50", names=tmp_path / "nob0.bval")  # fmt: skip
    np.savetxt(tmp_path / "long.bvec", bvecs * 1.2)
    _one_paragraph_error("fit-dti", str(dwi), "--bvec", str(tmp_path / "long.bvec"), "-o", out,
                         match=r"not unit length \(largest deviation 0\.200\)", names=tmp_path / "long.bvec")  # fmt: skip
    np.savetxt(tmp_path / "short.bvec", bvecs[:, :-3])
    _one_paragraph_error("fit-dti", str(dwi), "--bvec", str(tmp_path / "short.bvec"), "-o", out,
                         match=r"b-vectors have shape \(3, 65\), but the data has 68 volumes", names=tmp_path / "short.bvec")  # fmt: skip
    bvec.unlink()
    _one_paragraph_error("fit-dti", str(dwi), "-o", out, match=r"no b-values/b-vectors given.*--bval and --bvec",
                         names=dwi)  # fmt: skip
    _one_paragraph_error("fit-dti", str(dwi), "--bval", str(bval), "--bvec", str(tmp_path / "gone.bvec"), "-o", out,
                         match=r"b-vector file not found", names=tmp_path / "gone.bvec")  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_six_volume_tensor_needs_its_order(fitted, demo_dir, tmp_path):
    tensor = fitted[0] / "dti_tensor.nii.gz"
    _one_paragraph_error(
        "track", "deterministic", "--tensor", str(tensor), "--seed", str(demo_dir / "roi_arc_seed.nii.gz"),
        "-o", str(tmp_path / "t.trk"), "--device", "cpu",
        match=r"element order .* cannot be known.*--tensor-order", names=tensor,
    )  # fmt: skip


def test_fit_dti_output_is_checked_before_the_fit(dwi_files, tmp_path):
    """-o that is a file, or a folder that cannot be created, is an input error found before any
    work (no progress line), not an internal error after the fit."""
    dwi = str(dwi_files / "dwi.nii.gz")
    (tmp_path / "taken").write_text("a file")
    _one_paragraph_error("fit-dti", dwi, "-o", str(tmp_path / "taken"), "--device", "cpu",
                         match=r"exists and is a file, not a folder", names=tmp_path / "taken")  # fmt: skip
    _one_paragraph_error("fit-dti", dwi, "-o", "/proc/nope/out", "--device", "cpu",
                         match=r"cannot be written", names="/proc/nope/out")  # fmt: skip
    _one_paragraph_error("fit-dti", dwi, "-o", str(tmp_path / "taken" / "sub"), "--device", "cpu",
                         match=r"cannot be created: .*taken is a file", names=tmp_path / "taken" / "sub")  # fmt: skip
    assert (tmp_path / "taken").read_text() == "a file"


def test_select_checks_its_output_before_loading(demo_dir, tmp_path):
    """A bad -o is reported even though the tractogram does not exist: it was checked first."""
    include = str(demo_dir / "roi_arc_seed.nii.gz")
    _one_paragraph_error("select", str(tmp_path / "missing.trk"), "--include", include, "-o", str(tmp_path / "o.vtk"),
                         match=r"unknown tractogram format \.vtk", names=tmp_path / "o.vtk")  # fmt: skip
    _one_paragraph_error("select", str(tmp_path / "missing.trk"), "--include", include,
                         "-o", str(tmp_path / "no" / "o.trk"), match=r"output folder does not exist",
                         names=tmp_path / "no")  # fmt: skip
    _one_paragraph_error("select", str(tmp_path / "missing.trk"), "--include", include, "-o", "/proc/o.trk",
                         match=r"cannot be written", names="/proc/o.trk")  # fmt: skip


def test_demo_data_json(tmp_path):
    out = run_cli("demo-data", str(tmp_path / "demo"), "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["outdir"] == str(tmp_path / "demo")
    assert {"dwi.nii.gz", "dwi.bval", "dwi.bvec", "demo.json"} <= set(summary["files"])
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == summary["files"]  # no temporary files
    (tmp_path / "file").write_text("x")
    _one_paragraph_error("demo-data", str(tmp_path / "file"), match=r"exists and is a file", names=tmp_path / "file")


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["track", "geodesic", "--step", "-1"], "--step must be positive (a length in mm), got -1"),
        (["track", "geodesic", "--two-point", "--target-points", "0"], "--target-points must be at least 1, got 0"),
    ],
)
def test_geodesic_options_are_refused_in_the_units_they_were_given(fitted, demo_dir, tmp_path, argv, expect):
    """--step -1 was reported as -0.5 (the value in voxels); --target-points 0 was an internal error."""
    result = run_cli(*argv, "--tensor", str(fitted[0]), "--seed", str(demo_dir / "roi_arc_seed.nii.gz"), "--target",
                     str(demo_dir / "roi_arc_target.nii.gz"), "--device", "cpu", "-o", str(tmp_path / "g.trk"))  # fmt: skip
    assert result.returncode == 2 and expect in result.stderr and "internal error" not in result.stderr, result.stderr
    assert not (tmp_path / "g.trk").exists()


def test_geodesic_without_a_mask_stays_in_the_fitted_voxels(fitted, demo_dir, tmp_path):
    """It had no tracking mask by default: fibres ran outside the brain to a target in the air."""
    ref = nib.load(demo_dir / "roi_arc_seed.nii.gz")
    corner = np.zeros(ref.shape, np.uint8)
    corner[:3, :3, :3] = 1  # outside the brain
    nib.save(nib.Nifti1Image(corner, ref.affine), tmp_path / "corner.nii.gz")
    result = run_cli("track", "geodesic", "--tensor", str(fitted[0]), "--seed", str(demo_dir / "roi_arc_seed.nii.gz"),
                     "--target", str(tmp_path / "corner.nii.gz"), "--directions", "40", "--device", "cpu",
                     "-o", str(tmp_path / "g.trk"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "0 written" in result.stdout and "tracking mask does not join" in result.stderr
