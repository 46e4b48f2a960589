"""FSL and MRtrix conventions (issue 27): dtifit names read by fslpy, FreeSurfer .mgz, old-style
TRK, .tsf scalars beside .tck, --avoid."""

from __future__ import annotations

import os
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import DWI, load_tensor
from tractlens.app.pipelines.dti import DTI_MAPS, fit_dti_pipeline, write_dti_outputs

AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])  # positive determinant: FSL's frame flips x


def _tensor_series(rng, shape=(7, 6, 5), k=20):
    """A DWI series of random anisotropic tensors (noise-free), with its gradient table."""
    bvals = np.r_[0.0, np.full(k - 1, 1000.0)]
    g = rng.normal(size=(k, 3))
    g /= np.linalg.norm(g, axis=1)[:, None]
    g[0] = 0
    q, _ = np.linalg.qr(rng.normal(size=(*shape, 3, 3)))
    lam = np.sort(rng.uniform(2e-4, 2e-3, size=(*shape, 3)), axis=-1)[..., ::-1]
    d = np.einsum("...ij,...j,...kj->...ik", q, lam, q)
    adc = np.einsum("ki,...ij,kj->...k", g, d, g)
    data = (1000 * np.exp(-bvals * adc)).astype(np.float32)
    return data, bvals, g


@pytest.fixture(scope="module")
def dti_folder(tmp_path_factory):
    rng = np.random.default_rng(27)
    data, bvals, bvecs = _tensor_series(rng)
    mask = np.ones(data.shape[:3], bool)
    mask[0] = False  # a background slab
    result = fit_dti_pipeline(DWI(data=data, affine=AFFINE, bvals=bvals, bvecs=bvecs), mask=mask, device="cpu")
    folder = tmp_path_factory.mktemp("dtifit")
    files = write_dti_outputs(result, folder)
    return folder, files, result


def test_fit_dti_writes_dtifit_names_only(dti_folder):
    folder, files, _ = dti_folder
    written = sorted(p.name for p in folder.glob("*.nii.gz"))
    assert written == sorted(f"dti_{name}.nii.gz" for name in DTI_MAPS)
    assert {"dti_FA", "dti_MD", "dti_MO", "dti_S0", "dti_tensor"} <= {n.split(".")[0] for n in written}
    assert {f"dti_{a}{i}" for a in "VL" for i in (1, 2, 3)} <= {n.split(".")[0] for n in written}
    assert not (folder / "FA.nii.gz").exists() and not (folder / "tensor.nii.gz").exists()
    assert sorted(os.path.basename(f) for f in files.values()) == written


def test_fslpy_recognises_and_reads_a_fit_dti_folder(dti_folder):
    from fsl.data import dtifit

    folder, _, result = dti_folder
    assert dtifit.isDTIFitPath(str(folder))
    assert dtifit.getDTIFitDataPrefix(str(folder)) == "dti"
    tensor = dtifit.DTIFitTensor(str(folder))
    v = [np.asarray(getattr(tensor, f"V{i}")().data, dtype=np.float64) for i in (1, 2, 3)]
    lam = [np.asarray(getattr(tensor, f"L{i}")().data, dtype=np.float64) for i in (1, 2, 3)]
    mask = result.mask
    components = dtifit.eigendecompositionToComponents(*v, *lam)  # Dxx Dxy Dxz Dyy Dyz Dzz
    ours = nib.load(folder / "dti_tensor.nii.gz").get_fdata()
    scale = np.abs(ours[mask]).max()
    np.testing.assert_allclose(components[mask], ours[mask], atol=1e-5 * scale)
    # the eigenvectors are orthonormal and L1 >= L2 >= L3, as dtifit writes them
    gram = np.einsum("...i,...i->...", v[0], v[1])[mask]
    assert np.abs(gram).max() < 1e-5
    assert (lam[0][mask] >= lam[1][mask]).all() and (lam[1][mask] >= lam[2][mask]).all()


def test_mode_of_anisotropy_equals_dipys(dti_folder):
    from dipy.reconst.dti import mode

    folder, _, result = dti_folder
    mask = result.mask
    tensor = nib.load(folder / "dti_tensor.nii.gz").get_fdata()[mask]
    full = np.stack(
        [tensor[:, [0, 1, 2]], tensor[:, [1, 3, 4]], tensor[:, [2, 4, 5]]],
        axis=-1,
    )
    mo = nib.load(folder / "dti_MO.nii.gz").get_fdata()[mask]
    assert np.abs(mo - mode(full)).max() < 1e-4
    assert mo.min() >= -1 and mo.max() <= 1 and np.ptp(mo) > 0.5  # random tensors: a spread of modes


def _rename_to_old_names(folder, target):
    """The folder as earlier versions wrote it: FA.nii.gz, V1.nii.gz, tensor.nii.gz, ..."""
    target.mkdir()
    for path in folder.glob("dti_*.nii.gz"):
        name = path.name[len("dti_") :]
        if name.split(".")[0] in ("V2", "V3", "MO"):
            continue  # not written then
        (target / name).write_bytes(path.read_bytes())
    return target


def test_old_names_still_read_as_the_new(dti_folder, tmp_path):
    from tractlens.app.loaders import load_layers

    folder, _, _ = dti_folder
    old = _rename_to_old_names(folder, tmp_path / "old")
    new, before = load_tensor(folder), load_tensor(old)
    assert np.array_equal(new.data, before.data) and np.array_equal(new.affine, before.affine)
    assert np.array_equal(load_tensor(folder / "dti_tensor.nii.gz", "fsl").data, new.data)
    # the window's loader of a folder
    names_new = [layer.name for layer in load_layers(folder)]
    names_old = [layer.name for layer in load_layers(old)]
    assert any(n.endswith("FA") for n in names_new) and len(names_new) == len(names_old)


def run_cli(*args):
    code = "import sys; from tractlens.app.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def dwi_files(tmp_path_factory):
    rng = np.random.default_rng(3)
    data, bvals, bvecs = _tensor_series(rng)
    folder = tmp_path_factory.mktemp("dwi")
    nib.save(nib.Nifti1Image(data, AFFINE), folder / "dwi.nii.gz")
    np.savetxt(folder / "dwi.bval", bvals[None], fmt="%g")
    np.savetxt(folder / "dwi.bvec", bvecs.T, fmt="%.8f")
    mask = np.ones(data.shape[:3], np.uint8)
    nib.save(nib.Nifti1Image(mask, AFFINE), folder / "mask.nii.gz")
    return folder


def test_fit_dti_prefix_names_the_files_like_dtifits_out(dwi_files, tmp_path):
    out = run_cli("fit-dti", str(dwi_files / "dwi.nii.gz"), "--mask", str(dwi_files / "mask.nii.gz"),
                  "--device", "cpu", "--quiet", "--prefix", "subj01", "-o", str(tmp_path / "o"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "o" / "subj01_FA.nii.gz").exists() and (tmp_path / "o" / "subj01_V3.nii.gz").exists()
    assert load_tensor(tmp_path / "o").name.startswith("subj01")
    bad = run_cli("fit-dti", str(dwi_files / "dwi.nii.gz"), "--prefix", "a/b", "-o", str(tmp_path / "p"))
    assert bad.returncode == 2 and "prefix" in bad.stderr and "Traceback" not in bad.stderr


# --- FreeSurfer .mgz / .mgh ---------------------------------------------------------------------

GRID = (20, 18, 16)
LAS = np.array([[-2.0, 0, 0, 19.0], [0, 2.0, 0, -17.0], [0, 0, 2.0, -15.0], [0, 0, 0, 1]])


def _aparc_aseg_like(rng):
    """Blocks of FreeSurfer's label values (cortex 1000s/2000s, subcortical, white matter)."""
    values = np.array([2, 41, 17, 53, 10, 49, 1001, 1024, 1035, 2001, 2024, 2035], dtype=np.int32)
    labels = np.zeros(GRID, np.int32)
    for x0 in range(0, GRID[0], 5):
        for y0 in range(0, GRID[1], 6):
            for z0 in range(0, GRID[2], 8):
                labels[x0 : x0 + 5, y0 : y0 + 6, z0 : z0 + 8] = rng.choice(values)
    labels[:, :, :2] = 0
    return labels


def test_mgz_labels_give_the_same_connectome_as_the_nifti(tmp_path):
    from tractlens.app.cli import main
    from tractlens.app.io import load_labels, save_tractogram
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(5)
    labels = _aparc_aseg_like(rng)
    nib.save(nib.Nifti1Image(labels, LAS), tmp_path / "aparc+aseg.nii.gz")
    nib.save(nib.MGHImage(labels, LAS), tmp_path / "aparc+aseg.mgz")
    nib.save(nib.MGHImage(labels, LAS), tmp_path / "aparc+aseg.mgh")
    assert np.array_equal(load_labels(tmp_path / "aparc+aseg.mgz"), labels)
    starts = rng.uniform(0, np.array(GRID) - 1, size=(400, 3))
    ends = rng.uniform(0, np.array(GRID) - 1, size=(400, 3))
    t = np.linspace(0, 1, 12)[None, :, None]
    points = (starts[:, None] * (1 - t) + ends[:, None] * t).reshape(-1, 3).astype(np.float32)
    tract = Tractogram(points, np.arange(0, 401 * 12, 12), LAS, GRID)
    save_tractogram(tract, tmp_path / "t.trk")
    matrices = {}
    for suffix in (".nii.gz", ".mgz", ".mgh"):
        out = tmp_path / f"m{suffix}.csv"
        argv = ["connectome", str(tmp_path / "t.trk"), "--labels", str(tmp_path / f"aparc+aseg{suffix}")]
        assert main([*argv, "--device", "cpu", "--quiet", "-o", str(out)]) == 0
        matrices[suffix] = out.read_text()
    assert matrices[".mgz"] == matrices[".nii.gz"] == matrices[".mgh"]
    assert len(matrices[".mgz"].splitlines()) > 5  # regions were connected


def test_a_damaged_mgz_is_refused_naming_the_format(tmp_path):
    from tractlens.app.io import load_volume

    bad = tmp_path / "T1.mgz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(InputError, match="MGH"):
        load_volume(bad)
    mif = tmp_path / "x.mif"
    mif.write_bytes(b"mrtrix image")
    with pytest.raises(InputError, match=r"not a NIfTI file.*mgz"):
        load_volume(mif)


# --- old-style TRK -------------------------------------------------------------------------------

N_OLD = 156
VOXEL_MM = 2.0


def _old_trk(path, version: int):
    """A TrackVis file as old writers made it: no voxel-to-RAS matrix (version 1, or zeros in
    version 2), points in voxel-mm (the corner of voxel 0 at 0), written by hand."""
    from nibabel.streamlines.trk import header_2_dtype

    header = np.zeros((), dtype=header_2_dtype)
    header["magic_number"] = b"TRACK"
    header["dimensions"] = GRID
    header["voxel_sizes"] = (VOXEL_MM,) * 3
    header["voxel_order"] = b"LAS"
    header["version"] = version
    header["hdr_size"] = 1000
    header["nb_streamlines"] = N_OLD
    voxels = []
    body = bytearray()
    for k in range(N_OLD):
        x = np.arange(2, 2 + 3 + k % 10, dtype=np.float64)
        vox = np.stack([x, np.full_like(x, k % GRID[1]), np.full_like(x, k % GRID[2])], axis=1)
        voxels.append(vox)
        body += np.int32(len(vox)).tobytes() + ((vox + 0.5) * VOXEL_MM).astype("<f4").tobytes()
    path.write_bytes(header.tobytes() + bytes(body))
    return np.concatenate(voxels)


@pytest.mark.parametrize("version", [1, 2])
def test_old_style_trk_is_refused_without_a_reference(tmp_path, version):
    from tractlens.app.io import load_tractogram

    _old_trk(tmp_path / "old.trk", version)
    with pytest.raises(InputError, match=r"old-style \.trk.*no voxel-to-RAS") as caught:
        load_tractogram(tmp_path / "old.trk")
    message = str(caught.value)  # the ways a reference is given that exist (no command has --reference)
    assert "load_tractogram(FILE, reference=IMAGE)" in message and "--include" in message
    assert "--reference" not in message


@pytest.mark.parametrize("version", [1, 2])
def test_old_style_trk_is_placed_on_its_reference_with_a_warning(tmp_path, version, caplog):
    from tractlens.app.io import load_tractogram

    expected = _old_trk(tmp_path / "old.trk", version)
    nib.save(nib.Nifti1Image(np.zeros(GRID, np.uint8), LAS), tmp_path / "ref.nii.gz")
    with caplog.at_level("WARNING"):
        tract = load_tractogram(tmp_path / "old.trk", reference=tmp_path / "ref.nii.gz")
    assert "old-style" in caplog.text and "placed on the reference grid" in caplog.text
    assert len(tract) == N_OLD and tract.dimensions == GRID
    np.testing.assert_allclose(tract.affine, LAS, atol=1e-6)
    np.testing.assert_allclose(tract.points, expected, atol=1e-4)  # voxel indices of the reference
    other = tmp_path / "other.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((10, 9, 8), np.uint8), LAS), other)
    with pytest.raises(InputError, match="not on the grid"):
        load_tractogram(tmp_path / "old.trk", reference=other)


def test_select_on_an_old_style_trk_is_never_silent(tmp_path, capsys, caplog):
    """The issue's case: select kept 0 of 156 streamlines, exit 0, nothing said."""
    from tractlens.app.cli import main

    _old_trk(tmp_path / "old.trk", 1)
    mask = np.zeros(GRID, np.uint8)
    mask[3] = 1  # every streamline crosses x = 3
    nib.save(nib.Nifti1Image(mask, LAS), tmp_path / "roi.nii.gz")
    with caplog.at_level("WARNING"):
        code = main(["select", str(tmp_path / "old.trk"), "--include", str(tmp_path / "roi.nii.gz"), "--json",
                     "--quiet", "--device", "cpu", "-o", str(tmp_path / "kept.trk")])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0 and "old-style" in caplog.text
    assert '"selected": 156' in captured.out


# --- --avoid, probtrackx's name of --exclude -------------------------------------------------------


def _subcommands(parser, path=()):
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, (*path, name))


def test_avoid_is_an_alias_of_exclude_on_every_command_that_has_it():
    from tractlens.app.cli import build_parser

    with_exclude = [(path, p) for path, p in _subcommands(build_parser()) if "--exclude" in p._option_string_actions]
    names = {" ".join(path) for path, _ in with_exclude}
    assert {"select", "track deterministic", "track probabilistic"} <= names
    for path, p in with_exclude:
        assert p._option_string_actions.get("--avoid") is p._option_string_actions["--exclude"], path
        assert "--avoid" in p.format_help(), path


def test_avoid_parses_as_exclude():
    from tractlens.app.cli import build_parser

    parser = build_parser()
    common = ["select", "t.trk", "--include", "a.nii.gz", "-o", "o.trk"]
    by_exclude = parser.parse_args([*common, "--exclude", "x.nii.gz", "--exclude", "y.nii.gz"])
    by_avoid = parser.parse_args([*common, "--avoid", "x.nii.gz", "--exclude", "y.nii.gz"])
    assert vars(by_avoid) == vars(by_exclude) and by_avoid.exclude == ["x.nii.gz", "y.nii.gz"]
    prob = ["track", "probabilistic", "--samples", "s", "--seed", "m", "-o", "o"]
    assert parser.parse_args([*prob, "--avoid", "csf.nii.gz"]).exclude == "csf.nii.gz"


def test_generated_options_take_their_aliases_too():
    import argparse
    from dataclasses import dataclass, field

    from tractlens.app.cli.options import add_params, dest_of
    from tractlens.gpu.params import meta

    @dataclass
    class _MaskParams:
        exclude: str = field(default="", metadata=meta("Exclusion", "exclusion mask"))

    parser = argparse.ArgumentParser()
    add_params(parser, _MaskParams)
    assert getattr(parser.parse_args(["--avoid", "m.nii"]), dest_of(_MaskParams, "exclude")) == "m.nii"


# --- .tsf and weights beside a .tck --------------------------------------------------------------


def _tract_with_scalars(rng, n=30):
    from tractlens.app.model import Tractogram

    lines = [rng.uniform(0, 15, size=(int(k), 3)) for k in rng.integers(1, 20, size=n)]
    total = sum(len(line) for line in lines)
    return Tractogram.from_list(
        lines,
        affine=LAS,
        dimensions=GRID,
        point_scalars={"fa": rng.uniform(size=total).astype(np.float32)},
        streamline_scalars={"length_mm": rng.uniform(10, 100, size=n)},
    )


def _mrtrix_header(path):
    raw = path.read_bytes()
    head = raw[: raw.index(b"\nEND\n")].decode().splitlines()
    fields = dict(line.split(": ", 1) for line in head[1:])
    return head[0], fields, raw


def test_tck_scalars_are_written_as_mrtrix_tsf_and_weights_files(tmp_path):
    from tractlens.app.io import save_tractogram

    tract = _tract_with_scalars(np.random.default_rng(8))
    save_tractogram(tract, tmp_path / "bundle.tck")
    magic, fields, raw = _mrtrix_header(tmp_path / "bundle_fa.tsf")
    _, tck_fields, _ = _mrtrix_header(tmp_path / "bundle.tck")
    assert magic == "mrtrix track scalars" and fields["datatype"] == "Float32LE"
    assert int(fields["count"]) == len(tract) == int(tck_fields["count"])
    assert fields["timestamp"] == tck_fields["timestamp"]  # MRtrix pairs the files by it
    offset = int(fields["file"].split()[1])
    assert raw[offset - 4 : offset] == b"END\n"
    data = np.frombuffer(raw[offset:], "<f4")
    expected = []
    for i in range(len(tract)):
        expected += [*tract.point_scalars["fa"][tract.offsets[i] : tract.offsets[i + 1]], np.nan]
    np.testing.assert_array_equal(data, np.array([*expected, np.inf], np.float32))  # NaN between, Inf at the end
    weights = (tmp_path / "bundle_length_mm.txt").read_text().splitlines()
    assert len(weights) == len(tract)
    np.testing.assert_allclose([float(w) for w in weights], tract.streamline_scalars["length_mm"], rtol=1e-8)


def test_tck_with_its_side_files_reads_back_every_scalar(tmp_path, caplog):
    from tractlens.app.io import load_tractogram, save_tractogram
    from tractlens.app.io.tractogram_tsf import read_tsf

    rng = np.random.default_rng(9)
    tract = _tract_with_scalars(rng)
    save_tractogram(tract, tmp_path / "a.tck")
    back = load_tractogram(tmp_path / "a.tck", reference=(LAS, GRID))
    np.testing.assert_array_equal(back.point_scalars["fa"], tract.point_scalars["fa"])
    np.testing.assert_allclose(back.streamline_scalars["length_mm"], tract.streamline_scalars["length_mm"], rtol=1e-8)
    values, fields = read_tsf(tmp_path / "a_fa.tsf", tract.offsets)
    assert fields["datatype"] == "Float32LE" and int(fields["count"]) == len(tract)
    np.testing.assert_array_equal(values, tract.point_scalars["fa"])
    # a .tsf of other streamlines (another timestamp) is not taken for this tractogram
    other = _tract_with_scalars(rng, n=len(tract))
    save_tractogram(other, tmp_path / "b.tck")
    (tmp_path / "a_fa.tsf").write_bytes((tmp_path / "b_fa.tsf").read_bytes())
    with caplog.at_level("WARNING"):
        again = load_tractogram(tmp_path / "a.tck", reference=(LAS, GRID))
    assert "fa" not in again.point_scalars and "another tractogram" in caplog.text


def test_streamed_tck_side_files_are_those_of_the_whole(tmp_path):
    from tractlens.app.io import save_tractogram
    from tractlens.app.io.tractogram_stream import open_tractogram_writer

    tract = _tract_with_scalars(np.random.default_rng(10), n=40)
    save_tractogram(tract, tmp_path / "whole.tck")
    with open_tractogram_writer(tmp_path / "part.tck", LAS, GRID, background=True) as writer:
        for lo, hi in [(0, 1), (1, 1), (1, 17), (17, 40)]:
            writer.append(tract.subset(np.isin(np.arange(len(tract)), np.arange(lo, hi))))
    assert (tmp_path / "whole.tck").read_bytes() == (tmp_path / "part.tck").read_bytes()
    for name in ("fa.tsf", "length_mm.txt"):
        assert (tmp_path / f"whole_{name}").read_bytes() == (tmp_path / f"part_{name}").read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporaries
