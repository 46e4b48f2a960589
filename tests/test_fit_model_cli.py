"""``tractlens fit-model`` and its pipeline: files, world orientations, MCMC maps, clear errors on
acquisitions the model cannot use, and the docs' user-model example."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from tests.models_synth import angle_deg, multishell, noddi_watson_truth, noisy_signal, unit
from tractlens.app.cli import EXIT_INPUT, EXIT_OK, main
from tractlens.app.io.dwi import save_gradients
from tractlens.gpu.models import noddi_watson

SHAPE = (4, 3, 3)
MODELS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "models.md"


def _affine() -> np.ndarray:
    """2 mm voxels, rotated 30° about z and with x flipped (a radiological, negative-determinant grid)."""
    c, s = np.cos(np.pi / 6), np.sin(np.pi / 6)
    rot = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]]) @ np.diag([-2.0, 2.0, 2.0])
    affine = np.eye(4)
    affine[:3, :3] = rot
    affine[:3, 3] = (10, -20, 5)
    return affine


def write_dwi(folder: Path, bvals, bvecs, signal, name: str = "dwi") -> Path:
    """NIfTI + FSL bval/bvec (``bvecs`` in voxel axes) + an all-ones brain mask."""
    folder.mkdir(parents=True, exist_ok=True)
    affine = _affine()
    data = signal.reshape(*SHAPE, -1).astype(np.float32)
    path = folder / f"{name}.nii.gz"
    nib.save(nib.Nifti1Image(data, affine), path)
    save_gradients(bvals, bvecs, affine, folder / f"{name}.bval", folder / f"{name}.bvec")
    nib.save(nib.Nifti1Image(np.ones(SHAPE, np.uint8), affine), folder / "brain_mask.nii.gz")
    return path


@pytest.fixture(scope="module")
def noddi_dwi(tmp_path_factory):
    rng = np.random.default_rng(8)
    bvals, bvecs = multishell(rng, per_shell=60, b0=4)
    truth = noddi_watson_truth(int(np.prod(SHAPE)), rng)
    signal = noisy_signal(noddi_watson(), truth, bvals, bvecs, rng, snr=50)
    folder = tmp_path_factory.mktemp("noddi")
    return write_dwi(folder, bvals, bvecs, signal), truth


def test_fit_model_writes_the_maps_and_a_summary(noddi_dwi, tmp_path, capsys):
    dwi, truth = noddi_dwi
    out = tmp_path / "out"
    argv = ["fit-model", "noddi-watson", str(dwi), "--mask", str(dwi.parent / "brain_mask.nii.gz")]
    code = main([*argv, "--device", "cpu", "--seed-rng", "3", "-o", str(out), "--json", "--quiet"])
    assert code == EXIT_OK
    summary = json.loads(capsys.readouterr().out)
    for name in ("NDI", "ODI", "FWF", "dir", "residual", "S0", "mask"):
        assert name + ".nii.gz" in summary["files"]
    ndi = nib.load(out / "NDI.nii.gz").get_fdata().reshape(-1)
    odi = nib.load(out / "ODI.nii.gz").get_fdata().reshape(-1)
    assert np.abs(ndi - truth[:, 1]).mean() < 0.04
    assert np.abs(odi - truth[:, 2]).mean() < 0.03
    # dir.nii.gz holds world (RAS+) unit vectors: the true voxel-axis orientation through the affine
    dirs = nib.load(out / "dir.nii.gz").get_fdata().reshape(-1, 3)
    world = unit(truth[:, 4], truth[:, 5]) @ _affine()[:3, :3].T
    world /= np.linalg.norm(world, axis=1, keepdims=True)
    assert np.median(angle_deg(dirs, world)) < 3.0
    assert np.allclose(np.linalg.norm(dirs, axis=1), 1.0, atol=1e-5)
    record = json.loads((out / "fit_model.json").read_text())
    assert record["model"] == "noddi-watson"
    assert record["params"]["seed"] == 3 and record["params"]["d_par"] == pytest.approx(1.7e-3)
    assert record["inputs"]["dwi"].endswith("dwi.nii.gz") and record["version"]
    assert record["provenance"]["lm_s"] > 0 and "total_s" in record["provenance"]
    assert "fit-model" in " ".join(record["command_line"])


def test_mcmc_writes_standard_deviation_maps(noddi_dwi, tmp_path):
    dwi, _truth = noddi_dwi
    out = tmp_path / "mcmc"
    args = ["fit-model", "noddi-watson", str(dwi), "--method", "mcmc", "--burnin", "10", "--njumps", "20"]
    args += ["--sample-every", "2", "--device", "cpu", "-o", str(out), "--quiet"]
    assert main(args) == EXIT_OK
    for name in ("NDI_std", "ODI_std", "FWF_std"):
        std = nib.load(out / f"{name}.nii.gz").get_fdata()
        assert np.isfinite(std).all() and std.max() > 0


def test_bingham_writes_its_dispersion_maps(tmp_path):
    from tractlens.gpu.models import noddi_bingham

    rng = np.random.default_rng(2)
    bvals, bvecs = multishell(rng, shells=(1000.0, 2500.0), per_shell=40, b0=3)
    n = int(np.prod(SHAPE))
    # S0, v_ic, ODI_primary, ratio, v_iso, θ, φ, ψ
    truth = np.tile([100.0, 0.6, 0.3, 0.5, 0.1, 1.0, 0.5, 0.3], (n, 1))
    dwi = write_dwi(tmp_path, bvals, bvecs, noisy_signal(noddi_bingham(), truth, bvals, bvecs, rng, snr=100))
    out = tmp_path / "bingham"
    argv = ["fit-model", "noddi-bingham", str(dwi), "--mask", str(tmp_path / "brain_mask.nii.gz"), "--quiet"]
    assert main([*argv, "--device", "cpu", "-o", str(out)]) == EXIT_OK
    for name in ("NDI", "ODI", "ODI_primary", "ODI_secondary", "DAI", "FWF", "dir"):
        assert (out / f"{name}.nii.gz").exists(), name
    primary = nib.load(out / "ODI_primary.nii.gz").get_fdata()
    secondary = nib.load(out / "ODI_secondary.nii.gz").get_fdata()
    assert (secondary <= primary + 1e-9).all()  # the primary axis is the more dispersed one


@pytest.mark.parametrize(
    ("shells", "per_shell", "b0", "message"),
    [
        ((1000.0,), 60, 3, "single-shell"),
        ((1000.0, 2000.0), 2, 2, "cannot determine"),
        ((1000.0, 20000.0), 30, 2, "outside the range"),
        ((1000.0, 2000.0), 30, 0, "no b=0 volume"),
    ],
)
def test_unusable_acquisitions_get_a_clear_error(tmp_path, capsys, shells, per_shell, b0, message):
    rng = np.random.default_rng(0)
    bvals, bvecs = multishell(rng, shells=shells, per_shell=per_shell, b0=b0)
    signal = rng.uniform(50, 100, (int(np.prod(SHAPE)), len(bvals)))
    dwi = write_dwi(tmp_path, bvals, bvecs, signal)
    out = tmp_path / "never"
    assert main(["fit-model", "noddi-watson", str(dwi), "--device", "cpu", "-o", str(out), "--quiet"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert message in err and "error" in err
    assert not out.exists()


def test_bad_diffusivity_units_are_refused(noddi_dwi, tmp_path, capsys):
    dwi, _ = noddi_dwi
    code = main(["fit-model", "noddi-watson", str(dwi), "--d-par", "1.7", "-o", str(tmp_path / "x"), "--quiet"])
    assert code == EXIT_INPUT
    assert "mm²/s" in capsys.readouterr().err


def test_the_readme_user_model_example_runs(noddi_dwi, tmp_path, monkeypatch):
    """The user guide's "Microstructure models" Python example (docs/guide/models.md), run as written in a folder holding dwi.nii.gz."""
    section = MODELS_PAGE.read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    dwi, _truth = noddi_dwi
    for suffix in (".nii.gz", ".bval", ".bvec"):
        (tmp_path / f"dwi{suffix}").write_bytes(dwi.with_name("dwi" + suffix).read_bytes())
    (tmp_path / "brain_mask.nii.gz").write_bytes((dwi.parent / "brain_mask.nii.gz").read_bytes())
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, str(MODELS_PAGE), "exec"), namespace)
    result = namespace["result"]
    assert result.model.name == "ball-zeppelin"
    f = nib.load(tmp_path / "ball_zeppelin" / "f.nii.gz").get_fdata()
    assert f.shape == SHAPE and 0 < f.min() and f.max() < 1


def test_a_long_cpu_fit_is_announced():
    from tractlens.app.pipelines.fit_model import cpu_time_note
    from tractlens.gpu.models import Model

    assert cpu_time_note(noddi_watson(), 2000, 288, "lm") is None
    note = cpu_time_note(noddi_watson(), 900_000, 288, "lm")
    assert note.startswith("no GPU") and "min" in note
    assert "min" in cpu_time_note(noddi_watson(), 2000, 288, "mcmc")  # MCMC: ~10 times the LM's cost
    custom = Model("mine", noddi_watson().parameters, noddi_watson().signal)
    assert cpu_time_note(custom, 900_000, 288, "lm") is None


def test_ball_sticks_writes_its_fractions_and_both_orientations(noddi_dwi, tmp_path):
    dwi, _truth = noddi_dwi
    out = tmp_path / "bs"
    assert main(["fit-model", "ball-sticks", str(dwi), "--device", "cpu", "-o", str(out), "--quiet"]) == EXIT_OK
    for name in ("d", "f1", "f2", "dir", "dir2", "S0", "residual"):
        assert (out / f"{name}.nii.gz").exists(), name
    assert not (out / "NDI.nii.gz").exists()  # NODDI's maps belong to NODDI
    d = nib.load(out / "d.nii.gz").get_fdata()
    assert 1e-4 < np.median(d) < 3e-3  # mm²/s
