"""Every JSON summary carries its provenance: inputs (path, size, mtime), version, command line
(issue 27). One provenance helper (app/provenance.py) serves ``--json`` and the ``*.json`` files."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from tractlens import __version__
from tractlens.app.cli import build_parser, main

SHAPE = (14, 9, 7)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])

#: Subcommands whose --json is not run here, with the reason; every other one is run below.
NOT_RUN = {
    "import-dicom": "needs a DICOM series; its summary goes through the same emit (test_no_command_prints_json_itself)",
    "export-dicom": "needs a DICOM series; its summary goes through the same emit (test_no_command_prints_json_itself)",
    "fit-model": "needs a multi-shell series; its summary goes through the same emit (test_fit_model_cli.py runs it)",
    "batch": "needs a BIDS dataset and a Dask cluster; its summary goes through the same emit (test_batch.py)",
    "register": "needs two images of one head (these tensors are alike everywhere and are refused as different "
    "anatomy); its summary goes through the same emit (test_registration.py runs it)",
    "apply-transform": "needs a registration folder; its summary goes through the same emit (test_registration.py)",
}


def _leaves(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                below = list(_leaves(sub, (*path, name)))
                yield from below or [" ".join((*path, name))]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small series of tensors along x (a bundle to track), its mask, seed, labels and lesion."""
    folder = tmp_path_factory.mktemp("prov")
    rng = np.random.default_rng(1)
    k = 31
    bvals = np.r_[0.0, np.full(k - 1, 1000.0)]
    g = rng.normal(size=(k, 3))
    g /= np.linalg.norm(g, axis=1)[:, None]
    g[0] = 0
    d = np.diag([1.7e-3, 0.3e-3, 0.3e-3])
    adc = np.einsum("ki,ij,kj->k", g, d, g)
    signal = 1000 * np.exp(-bvals * adc)
    data = np.broadcast_to(signal, (*SHAPE, k)) * rng.normal(1, 0.01, (*SHAPE, k))
    nib.save(nib.Nifti1Image(data.astype(np.float32), AFFINE), folder / "dwi.nii.gz")
    np.savetxt(folder / "dwi.bval", bvals[None], fmt="%g")
    np.savetxt(folder / "dwi.bvec", g.T, fmt="%.8f")
    masks = {"mask": np.ones(SHAPE), "seed": np.zeros(SHAPE), "target": np.zeros(SHAPE), "lesion": np.zeros(SHAPE)}
    masks["seed"][2, 3:6, 2:5] = 1
    masks["target"][11, 3:6, 2:5] = 1
    masks["lesion"][7, 4, 3] = 1
    for name, mask in masks.items():
        nib.save(nib.Nifti1Image(mask.astype(np.uint8), AFFINE), folder / f"{name}.nii.gz")
    labels = np.zeros(SHAPE, np.int32)
    labels[:4], labels[10:] = 1, 2
    nib.save(nib.Nifti1Image(labels, AFFINE), folder / "labels.nii.gz")
    from tractlens.app.bundles.phantom import MNI_2MM
    from tractlens.app.grid import Grid
    from tractlens.app.io.transforms import save_registration
    from tractlens.app.registration import Registration

    identity = Registration(MNI_2MM, Grid(AFFINE, SHAPE), np.eye(4), kind="identity", fixed_name="mni",
                            moving_name="dwi", template="mni", template_side="fixed")  # fmt: skip
    save_registration(identity, folder / "reg_mni", {})  # for tractlens bundles (its regions miss this grid)
    return folder


def _commands(f: Path) -> list[tuple[str, list[str], list[Path]]]:
    """(subcommand, argv, inputs that must be listed), in an order where each output feeds the next."""
    dwi, mask, seed = str(f / "dwi.nii.gz"), str(f / "mask.nii.gz"), str(f / "seed.nii.gz")
    cpu = ["--device", "cpu"]
    return [
        ("info", ["info"], []),
        ("demo-data", ["demo-data", str(f / "demo")], []),
        (
            "fit-dti",
            ["fit-dti", dwi, "--mask", mask, *cpu, "-o", str(f / "dti")],
            [f / "dwi.nii.gz", f / "mask.nii.gz"],
        ),
        ("fit-csd", ["fit-csd", dwi, "--mask", mask, "--lmax", "4", *cpu, "-o", str(f / "csd")], [f / "dwi.nii.gz"]),
        (
            "fit-ballstick",
            [
                "fit-ballstick",
                dwi,
                "--mask",
                mask,
                "--nfibres",
                "1",
                "--burnin",
                "20",
                "--njumps",
                "20",
                "--sampleevery",
                "10",
                *cpu,
                "-o",
                str(f / "bpx"),
            ],
            [f / "dwi.nii.gz"],
        ),
        (
            "track deterministic",
            [
                "track",
                "deterministic",
                "--tensor",
                str(f / "dti"),
                "--seed",
                seed,
                "--min-length",
                "2",
                *cpu,
                "-o",
                str(f / "det.trk"),
            ],
            [f / "dti", f / "seed.nii.gz"],
        ),
        (
            "track fod-probabilistic",
            [
                "track",
                "fod-probabilistic",
                "--fod",
                str(f / "csd"),
                "--seed",
                seed,
                "--min-length",
                "2",
                *cpu,
                "-o",
                str(f / "fod.trk"),
            ],
            [f / "csd", f / "seed.nii.gz"],
        ),
        (
            "track geodesic",
            [
                "track",
                "geodesic",
                "--tensor",
                str(f / "dti"),
                "--seed",
                seed,
                "--target",
                str(f / "target.nii.gz"),
                *cpu,
                "-o",
                str(f / "geo.trk"),
            ],
            [f / "dti"],
        ),
        (
            "track probabilistic",
            [
                "track",
                "probabilistic",
                "--samples",
                str(f / "bpx"),
                "--seed",
                seed,
                "--nsamples",
                "5",
                *cpu,
                "-o",
                str(f / "prob"),
            ],
            [f / "bpx", f / "seed.nii.gz"],
        ),
        ("envelopes", ["envelopes", str(f / "prob"), "-o", str(f / "envelopes")], [f / "prob"]),
        ("atlas", ["atlas", "list"], []),
        ("select", ["select", str(f / "det.trk"), "--include", seed, *cpu, "-o", str(f / "sel.tck")], [f / "det.trk"]),
        (
            "connectome",
            ["connectome", str(f / "det.trk"), "--labels", str(f / "labels.nii.gz"), *cpu, "-o", str(f / "m.csv")],
            [f / "det.trk", f / "labels.nii.gz"],
        ),
        (
            "profile",
            ["profile", str(f / "det.trk"), "--map", str(f / "dti" / "dti_FA.nii.gz"), *cpu, "-o", str(f / "p.csv")],
            [f / "det.trk", f / "dti" / "dti_FA.nii.gz"],
        ),
        (  # the tidy form (a named map), then its figure
            "profile",
            ["profile", str(f / "det.trk"), "--map", f"FA={f / 'dti' / 'dti_FA.nii.gz'}", *cpu, "-o", str(f / "t.csv")],
            [f / "det.trk", f / "dti" / "dti_FA.nii.gz"],
        ),
        ("plot-profiles", ["plot-profiles", str(f / "t.csv"), "-o", str(f / "t.png")], [f / "t.csv"]),
        ("distance", ["distance", str(f / "det.trk"), "--lesion", str(f / "lesion.nii.gz"), *cpu], [f / "det.trk"]),
        (
            "stats",
            ["stats", str(f / "det.trk"), "--map", str(f / "dti" / "dti_FA.nii.gz"), "-o", str(f / "s.csv")],
            [f / "det.trk"],
        ),
        (
            "commit",
            [
                "commit",
                "--dwi",
                dwi,
                "--tractogram",
                str(f / "det.trk"),
                "--mask",
                mask,
                "--max-iter",
                "20",
                *cpu,
                "-o",
                str(f / "commit"),
            ],
            [f / "dwi.nii.gz", f / "det.trk"],
        ),
        (
            "bundles",
            [
                "bundles",
                "--samples",
                str(f / "bpx"),
                "--registration",
                str(f / "reg_mni"),
                "--bundles",
                "FMI",
                "--nsamples",
                "2",
                *cpu,
                "-o",
                str(f / "bundles"),
            ],
            [f / "bpx", f / "reg_mni"],
        ),
    ]


def _check_provenance(summary: dict, command_line, inputs) -> None:
    assert summary["version"] == __version__
    assert summary["command_line"] == command_line
    listed = {entry["path"]: entry for entry in summary["inputs"]}
    for path in inputs:
        entry = listed[str(Path(path).absolute())]
        stat = Path(path).stat()
        if Path(path).is_file():
            assert entry["size"] == stat.st_size
        assert datetime.datetime.fromisoformat(entry["mtime"]).timestamp() == pytest.approx(stat.st_mtime, abs=1e-3)


def test_every_subcommands_json_carries_inputs_version_and_command_line(data, capsys, monkeypatch):
    monkeypatch.setenv("TRACTLENS_DISABLE_GPU", "1")
    commands = _commands(data)
    assert {name for name, _, _ in commands} | set(NOT_RUN) == set(_leaves(build_parser()))
    for name, argv, inputs in commands:
        argv = [*argv, "--json", "--quiet"]
        assert main(argv) == 0, (name, capsys.readouterr().err)
        summary = json.loads(capsys.readouterr().out)
        _check_provenance(summary, ["tractlens", *argv], inputs)
        outputs = {str(Path(a).absolute()) for a in argv[argv.index("-o") + 1 :][:1]} if "-o" in argv else set()
        assert not outputs & {entry["path"] for entry in summary["inputs"]}, name  # outputs are not inputs
    # the summaries written beside the outputs carry the same
    for name, file, listed in [
        ("fit-dti", "dti/fit_dti.json", None),
        ("fit-csd", "csd/fit_csd.json", None),
        ("commit", "commit/commit.json", None),
        ("fit-ballstick", "bpx/fit_ballstick.json", [data / "dwi.nii.gz"]),  # the series it was fitted to
        ("track probabilistic", "prob/probtrackx.json", [data / "bpx"]),  # the samples tracked
    ]:
        argv = next(a for n, a, _ in commands if n == name)
        inputs = listed or next(i for n, _, i in commands if n == name)
        written = json.loads((data / file).read_text())
        _check_provenance(written, ["tractlens", *argv, "--json", "--quiet"], inputs)


def test_a_summary_written_from_python_names_the_call(data, tmp_path):
    from tractlens.app.io import load_dwi
    from tractlens.app.pipelines.dti import fit_dti_pipeline, write_dti_outputs

    dwi = load_dwi(data / "dwi.nii.gz")
    result = fit_dti_pipeline(dwi, mask_path=data / "mask.nii.gz", device="cpu")
    write_dti_outputs(result, tmp_path / "out", prefix="subj")
    written = json.loads((tmp_path / "out" / "fit_dti.json").read_text())
    assert written["command_line"].startswith("tractlens.write_dti_outputs(")
    assert "prefix='subj'" in written["command_line"] and str(tmp_path / "out") in written["command_line"]
    paths = [entry["path"] for entry in written["inputs"]]
    assert str((data / "dwi.nii.gz").absolute()) in paths and str((data / "dwi.bval").absolute()) in paths
    assert str((data / "mask.nii.gz").absolute()) in paths
    assert written["version"] == __version__ and written["prefix"] == "subj"


def test_no_command_prints_json_itself():
    """Every --json summary goes through _common.emit, which adds the provenance."""
    folder = Path(__file__).resolve().parents[1] / "app" / "cli"
    offenders = [p.name for p in folder.glob("*.py") if p.name != "_common.py" and "json.dumps" in p.read_text()]
    assert offenders == []


def test_describe_input_of_a_folder_and_of_a_missing_file(tmp_path):
    from tractlens.app.provenance import describe_input

    (tmp_path / "a").write_bytes(b"12345")
    (tmp_path / "b").write_bytes(b"123")
    entry = describe_input(tmp_path)
    assert entry["size"] == 8 and entry["path"] == str(tmp_path.absolute())
    gone = describe_input(tmp_path / "gone.nii.gz")
    assert "size" not in gone and gone["error"]
    assert os.path.isabs(gone["path"])
