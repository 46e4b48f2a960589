"""The template and atlases of the anatomy extra, and ``tractlens atlas`` onto a subject's grid."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.atlases import find_regions, load_atlas, load_template, side_of
from tractlens.app.cli import main
from tractlens.app.grid import Grid
from tractlens.app.io.lut import load_lut
from tractlens.app.io.nifti import load_labels
from tractlens.app.io.transforms import save_registration
from tractlens.app.registration import Registration

REQUIRED = {"harvard-oxford-cortical", "harvard-oxford-subcortical", "juelich", "aal", "desikan-killiany"}


def test_atlas_list_names_every_required_atlas_with_its_licence_and_citation(capsys):
    assert main(["atlas", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    rows = {row["name"]: row for row in listed["atlases"]}
    assert REQUIRED <= set(rows)
    for row in rows.values():
        assert row["licence"] and row["citation"] and row["title"]
    assert listed["templates"][0]["name"] == "mni"


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_atlas_loads_as_labels_in_mni_space_with_a_name_for_each_value(name):
    labels, affine, table = load_atlas(name)
    assert labels.dtype == np.int32 and labels.ndim == 3
    values = set(np.unique(labels).tolist()) - {0}
    named = {value for value, _ in table}
    assert values and values <= named
    # the atlas lies inside the MNI box the template covers (within a few mm)
    template, template_affine = load_template("mni")
    centre = affine[:3, :3] @ (np.array(labels.shape) / 2) + affine[:3, 3]
    t_centre = template_affine[:3, :3] @ (np.array(template.shape) / 2) + template_affine[:3, 3]
    assert np.linalg.norm(centre - t_centre) < 25


def test_the_juelich_atlas_carries_its_white_matter_tracts():
    tracts = find_regions("juelich", "corticospinal")
    assert {side_of(name) for _, name in tracts} == {"left", "right"}


def test_regions_are_found_by_name_and_side_in_every_spelling():
    assert [n for _, n in find_regions("harvard-oxford-cortical", "precentral", "left")] == ["Left_Precentral_Gyrus"]
    assert [n for _, n in find_regions("aal", "precentral", "right")] == ["Precentral_R"]
    dk = [n for _, n in find_regions("desikan-killiany", "precentral", "left")]
    assert dk and all("lh" in n for n in dk)
    assert side_of("Left-Thalamus-Proper") == "left" and side_of("Brain-Stem") is None


def test_an_unknown_atlas_names_the_choices(capsys):
    assert main(["atlas", "brodmann", "--registration", "x", "--reference", "y", "-o", "z.nii.gz"]) == 2
    assert "aal" in capsys.readouterr().err


def test_atlas_on_a_subject_grid_follows_the_registration_and_writes_its_lookup_table(tmp_path, capsys):
    labels, affine, table = load_atlas("aal")
    atlas_grid = Grid(affine, labels.shape)
    # the subject: the AAL grid moved by exactly (2, -1, 3) voxels, so nearest labels are the atlas's own voxels
    shift_vox = np.array([2, -1, 3])
    subject_affine = affine.copy()
    subject_affine[:3, 3] += affine[:3, :3] @ shift_vox
    subject = Grid(subject_affine, labels.shape)
    nib.save(nib.Nifti1Image(np.zeros(labels.shape, np.float32), subject_affine), tmp_path / "subject.nii.gz")
    # a template registration: fixed = MNI (the atlas grid), moving = subject; subject point p <-> MNI point p
    reg = Registration(atlas_grid, subject, np.eye(4), kind="affine", fixed_name="mni", moving_name="subject",
                       template="mni", template_side="fixed")  # fmt: skip
    save_registration(reg, tmp_path / "reg", {})
    out = tmp_path / "aal_subject.nii.gz"
    assert main(["atlas", "aal", "--registration", str(tmp_path / "reg"), "--reference", str(tmp_path / "subject.nii.gz"),
                 "-o", str(out), "--json"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    got = load_labels(out)
    expected = np.zeros_like(labels)
    nx, ny, nz = labels.shape
    sx, sy, sz = shift_vox
    # subject voxel v sits at atlas voxel v + shift
    expected[max(0, -sx) : nx - max(0, sx), max(0, -sy) : ny - max(0, sy), max(0, -sz) : nz - max(0, sz)] = labels[
        max(0, sx) : nx - max(0, -sx), max(0, sy) : ny - max(0, -sy), max(0, sz) : nz - max(0, -sz)
    ]
    np.testing.assert_array_equal(got, expected)
    lut = load_lut(tmp_path / "aal_subject.tsv")
    assert lut.names == dict(table)
    assert summary["structures"] == len(table) and "GNU" in summary["licence"]


def test_an_atlas_needs_a_registration_to_the_template(tmp_path, capsys):
    g = Grid(np.diag([4.0, 4, 4, 1]), (10, 10, 10))
    save_registration(Registration(g, g, np.eye(4)), tmp_path / "reg", {})
    nib.save(nib.Nifti1Image(np.zeros(g.shape, np.float32), g.affine), tmp_path / "s.nii.gz")
    code = main(["atlas", "aal", "--registration", str(tmp_path / "reg"), "--reference", str(tmp_path / "s.nii.gz"),
                 "-o", str(tmp_path / "a.nii.gz")])  # fmt: skip
    assert code == 2 and "register IMAGE mni" in capsys.readouterr().err
    assert not (tmp_path / "a.nii.gz").exists()


def test_the_mni_word_registers_against_the_shipped_template(tmp_path):
    from tractlens.app.anatomy import load_for_registration

    image = load_for_registration("mni")
    template, affine = load_template("mni")
    assert image.template == "mni" and image.data.shape == template.shape == (182, 218, 182)
    assert np.allclose(image.grid.affine, affine)


@pytest.mark.parametrize("kind", ["affine", "syn"])
def test_atlas_labels_are_the_compiled_loop_s_bit_for_bit(kind, monkeypatch):
    """An atlas is drawn with NumPy in a fresh command (no numba start); its labels are the ones
    numba's loop draws (the path before), through an affine and through an affine + SyN field."""
    import tractlens.gpu.resample as engine
    from tests.anatomy_synth import rigid
    from tractlens.app.anatomy import atlas_on_subject

    if engine.numba_module() is None:
        pytest.fail("numba (the cpu extra, in the test extra) is not installed")
    mni = Grid(np.array([[-2.0, 0, 0, 90], [0, 2, 0, -126], [0, 0, 2, -72], [0, 0, 0, 1]]), (91, 109, 91))
    subject = Grid(rigid(8, -5, 6, (3.0, -4.0, 5.0)) @ np.diag([1.5, 1.5, 1.5, 1]) @ np.eye(4)
                   + np.array([[0, 0, 0, -80], [0, 0, 0, -110], [0, 0, 0, -60], [0, 0, 0, 0]]), (110, 130, 100))  # fmt: skip
    warp = inverse = None
    if kind == "syn":  # a smooth field of up to ~4 mm on the MNI working grid
        x, y, z = np.meshgrid(*[np.linspace(0, 3, n) for n in mni.shape], indexing="ij")
        inverse = np.stack([np.sin(y + z), np.cos(x - z), np.sin(x) * np.cos(y)], -1).astype(np.float32) * 3.0
        warp = -inverse
    affine = rigid(4, -3, 5, (3.0, -2.0, 2.0)) @ np.diag([1.04, 0.97, 1.02, 1.0])
    reg = Registration(mni, subject, affine, warp, inverse, kind=kind, fixed_name="mni", moving_name="subject",
                       template="mni", template_side="fixed")  # fmt: skip
    drawn, _ = atlas_on_subject("harvard-oxford-cortical", reg, subject, device="cpu")
    monkeypatch.setattr(engine, "COMPILED_START_SAMPLES", {0: 0, 1: 0})
    compiled, _ = atlas_on_subject("harvard-oxford-cortical", reg, subject, device="cpu")
    assert len(np.unique(drawn)) > 50  # the atlas lands on the subject grid
    np.testing.assert_array_equal(drawn, compiled)
