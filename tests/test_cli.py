"""The tractlens command: outputs, JSON, and clean errors with the documented exit codes."""

import json
import os
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

from app.cli import main
from tests.conftest import installed_tool


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
    assert expected <= {f.split(".")[0] for f in summary["files"]}
    shapes = {name: nib.load(out / f"{name}.nii.gz").shape for name in expected}
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
    mask = nib.load(out / "mask.nii.gz").get_fdata() > 0
    ref = TensorModel(gradient_table(bvals, bvecs=bvecs)).fit(data, mask=mask)
    fa = nib.load(out / "FA.nii.gz").get_fdata()
    assert np.abs(fa - ref.fa)[mask].max() < 1e-4  # float32 files
    lower = ref.lower_triangular()[mask]  # DIPY: xx, xy, yy, xz, yz, zz
    tensor = nib.load(out / "tensor.nii.gz").get_fdata()[mask]  # FSL: xx, xy, xz, yy, yz, zz
    np.testing.assert_allclose(tensor, lower[:, [0, 1, 3, 2, 4, 5]], atol=1e-8)
    v1 = nib.load(out / "V1.nii.gz").get_fdata()[mask]
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
    from app.io import load_tractogram

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
        "select", str(demo_dir / "bundles.trk"), "-o", str(tmp_path / "o.trk"), match="at least one --include mask"
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
