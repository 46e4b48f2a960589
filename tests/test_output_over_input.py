"""No command replaces one of its own inputs: an output named like an input (however the path is
written) is refused before any work, and the input is kept as it was."""

from __future__ import annotations

import shutil

import pytest

from tractlens.app.cli import main


@pytest.fixture
def bundles(demo_dir, tmp_path):
    shutil.copy(demo_dir / "bundles.trk", tmp_path / "b.trk")
    shutil.copy(demo_dir / "parcellation.txt", tmp_path / "lut.txt")
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ["connectome", "b.trk", "--labels", "{demo}/parcellation.nii.gz", "-o", "b.trk"],
        ["connectome", "b.trk", "--labels", "{demo}/parcellation.nii.gz", "--lut", "lut.txt", "-o", "./lut.txt"],
        ["select", "b.trk", "--include", "{demo}/roi_arc_seed.nii.gz", "-o", "../{name}/b.trk"],
        ["profile", "b.trk", "--map", "{demo}/mask.nii.gz", "-o", "b.trk"],
    ],
)
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(bundles, demo_dir, monkeypatch, capsys, argv):
    monkeypatch.chdir(bundles)
    before = {p.name: p.read_bytes() for p in bundles.iterdir()}
    words = [w.format(demo=demo_dir, name=bundles.name) for w in argv]
    assert main([*words, "--device", "cpu"] if argv[0] != "select" else words) == 2
    assert "is also an input of this command" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in bundles.iterdir()} == before


def test_an_output_beside_its_input_is_written(bundles, demo_dir, monkeypatch):
    monkeypatch.chdir(bundles)
    assert (
        main(["select", "b.trk", "--include", str(demo_dir / "roi_arc_seed.nii.gz"), "-o", "kept.trk", "--quiet"]) == 0
    )
    assert (bundles / "kept.trk").is_file()
