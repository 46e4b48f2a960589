"""Named bundles (issue 39): protocols, ``run_bundles`` / ``tractlens bundles`` on an MNI phantom whose
bundles follow their textbook course through their protocol's regions (app.bundles.phantom).

Validity: each bundle tracked keeps ≥ 80 % of its streamlines inside its true tube (a streamline is
inside when ≥ 90 % of its points lie within the tube's radius plus one voxel of the course). The
CI runs a subset of bundles at few samples; tests/benchmarks/validate_bundles.py runs them all.
"""

from __future__ import annotations

import json
import logging
import shutil

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.bundles import bundle_colour, bundle_names, protocol_of, run_bundles
from tractlens.app.bundles.phantom import (
    course_curve,
    make_phantom,
    phantom_grid,
    share_inside,
    write_bedpostx,
    write_fod,
    write_identity_registration,
    write_tensor,
)
from tractlens.app.bundles.protocols import region_contains
from tractlens.app.cli import main
from tractlens.app.errors import InputError
from tractlens.app.io import load_tractogram
from tractlens.app.params import BundleParams, FodProbabilisticParams, ProbParams

RADIUS_MM, VOXEL_MM = 4.0, 2.5
#: Few samples and a coarse step: the NumPy engine in CI.
PROB = ProbParams(n_samples=8, step_mm=1.0, n_steps=300)
KEEP = BundleParams(keep_streamlines=120, seeds_per_voxel=3)
FAMILIES = ("CST", "AF", "SLF", "IFOF", "ILF", "UF", "CBD", "CBP", "ATR", "OR", "FAT", "VOF")


@pytest.fixture(scope="module")
def phantom_dir(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("TRACTLENS_BEDPOSTX_CACHE", "0")
    folder = tmp_path_factory.mktemp("bundle_phantom")
    phantom = make_phantom(bundle_names(), phantom_grid(VOXEL_MM), radius_mm=RADIUS_MM)
    write_bedpostx(phantom, folder / "bpx", n_samples=8)
    write_identity_registration(phantom.grid, folder / "reg")
    return folder, phantom


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _inside_share(name: str, tractogram) -> float:
    points = tractogram.points @ tractogram.affine[:3, :3].T + tractogram.affine[:3, 3]
    return share_inside(name, points, tractogram.offsets, RADIUS_MM, VOXEL_MM, point_share=0.9)[0]


def test_protocols_name_every_required_bundle_with_a_citation():
    names = bundle_names()
    assert len(names) >= 20
    for family in FAMILIES:
        assert {f"{family}_L", f"{family}_R"} <= set(names), family
    assert {"FMA", "FMI"} <= set(names)
    for name in names:
        protocol = protocol_of(name)
        assert "Warrington" in protocol.citation and protocol.protocol.startswith("XTRACT")
        assert protocol.adapted and protocol.seed and protocol.targets
        assert all(0 <= c <= 1 for c in bundle_colour(name))
        assert name.isascii()
    assert bundle_colour("CST_L") != bundle_colour("CST_R")
    with pytest.raises(InputError, match="no bundle named 'CST'"):
        protocol_of("CST")


@pytest.mark.parametrize("name", bundle_names())
def test_each_course_passes_its_seed_and_targets_and_avoids_its_exclusion(name):
    protocol = protocol_of(name)
    curve, _ = course_curve(protocol.course)
    assert region_contains(protocol.seed, curve).any()
    for target in protocol.targets:
        assert region_contains(target, curve).any()
    assert not region_contains(protocol.exclude, curve).any()


def test_right_protocols_mirror_the_left_ones():
    left, right = protocol_of("AF_L"), protocol_of("AF_R")
    point = np.array([[-50.0, -40.0, -4.0]])
    assert region_contains(left.seed, point)[0] and region_contains(right.seed, point * [-1, 1, 1])[0]
    assert not region_contains(right.seed, point)[0]


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_probabilistic_bundles_keep_to_their_true_tube(phantom_dir, tmp_path, device):
    folder, _ = phantom_dir
    names = ["CST_L", "AF_R", "FMA"]
    result = run_bundles(registration=folder / "reg", output=tmp_path / "out", samples=folder / "bpx", names=names,
                         params=KEEP, prob_params=PROB, device=device, seed_rng=3)  # fmt: skip
    summary = json.loads((tmp_path / "out" / "bundles.json").read_text())
    assert summary["format"] == "tractlens-bundles" and summary["version"] == 1
    assert summary["engine"] == "probabilistic" and summary["seed_rng"] == 3
    assert summary["protocols_version"] and summary["registration"] == str(folder / "reg")
    assert list(summary["bundles"]) == names
    for name in names:
        record = summary["bundles"][name]
        assert record["status"] == "ok", record["message"]
        assert record["file"] == f"{name}.trx" and record["density"] == f"{name}_density.nii.gz"
        assert 0 < record["streamlines"] <= KEEP.keep_streamlines
        assert record["streamlines"] <= record["waytotal"] <= record["tracked"]
        assert record["volume_mm3"] > 0
        assert record["protocol"]["citation"].startswith("Warrington")
        tract = load_tractogram(tmp_path / "out" / record["file"])
        assert len(tract) == record["streamlines"]
        assert tract.dimensions == tuple(nib.load(folder / "bpx" / "nodif_brain_mask.nii.gz").shape)
        share = _inside_share(name, tract)
        assert share >= 0.8, (name, share)
        density = nib.load(tmp_path / "out" / record["density"])
        data = np.asarray(density.dataobj)
        counts = data * record["waytotal"]  # visits / waytotal: whole visit counts once multiplied back
        assert data.dtype == np.float32 and 0 < data.max() <= 1.0
        np.testing.assert_allclose(counts, np.round(counts), atol=1e-3)
        assert result.bundles[name].tractogram is not None


def test_lesion_in_a_seed_region_reports_the_bundle_by_name(phantom_dir, tmp_path, caplog):
    folder, _ = phantom_dir
    lesioned = tmp_path / "bpx"
    shutil.copytree(folder / "bpx", lesioned)
    mask_img = nib.load(lesioned / "nodif_brain_mask.nii.gz")
    mask = np.asarray(mask_img.dataobj).astype(np.uint8)
    ijk = np.indices(mask.shape).reshape(3, -1).T
    mni = ijk @ mask_img.affine[:3, :3].T + mask_img.affine[:3, 3]
    sphere = protocol_of("CST_L").seed[0]
    lesion = np.linalg.norm(mni - np.asarray(sphere.a), axis=1) <= sphere.b + VOXEL_MM
    mask[lesion.reshape(mask.shape)] = 0  # a lesion over the left CST's seed region (and its edge voxels)
    curve, _ = course_curve(protocol_of("AF_L").course)
    middle = curve[len(curve) // 2]
    cut = (np.abs(mni - middle) <= 8.0).all(axis=1).reshape(mask.shape)
    mask[cut] = 0  # and one across the middle of the left arcuate: seeds and targets intact, nothing passes
    nib.save(nib.Nifti1Image(mask, mask_img.affine), lesioned / "nodif_brain_mask.nii.gz")
    with caplog.at_level(logging.WARNING, logger="tractlens.bundles"):
        result = run_bundles(registration=folder / "reg", output=tmp_path / "out", samples=lesioned,
                             names="CST_L,AF_L,FMA", params=KEEP, prob_params=PROB, device="cpu")  # fmt: skip
    records = json.loads((tmp_path / "out" / "bundles.json").read_text())["bundles"]
    cst, af = records["CST_L"], records["AF_L"]
    assert cst["status"] == "regions-missed" and cst["region_voxels"]["seed"] == 0
    assert cst["region_voxels"]["target 1"] > 0 and "CST_L" in cst["message"] and "seed" in cst["message"]
    assert af["status"] == "empty" and af["waytotal"] == 0 and af["tracked"] > 0
    assert "AF_L" in af["message"] and str(af["tracked"]) in af["message"]
    assert records["FMA"]["status"] == "ok"
    assert {o.name for o in result.problems} == {"CST_L", "AF_L"}
    assert "CST_L" in caplog.text and "AF_L" in caplog.text
    assert len(load_tractogram(tmp_path / "out" / "CST_L.trx")) == 0  # the files are there, empty, and said so


def test_same_seed_gives_the_same_files_bit_for_bit(phantom_dir, tmp_path):
    folder, _ = phantom_dir
    outputs = []
    for run, seed in enumerate((5, 5, 6)):
        out = tmp_path / f"out{run}"
        run_bundles(registration=folder / "reg", output=out, samples=folder / "bpx", names=["FMI"], params=KEEP,
                    prob_params=PROB, device="cpu", seed_rng=seed)  # fmt: skip
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert set(outputs[0]) == {"bundles.json", "FMI.trx", "FMI_density.nii.gz"}
    assert outputs[0] == outputs[1]
    assert outputs[0]["FMI.trx"] != outputs[2]["FMI.trx"]


def test_same_seed_gives_the_same_files_on_the_fod_engine(phantom_dir, tmp_path):
    folder, phantom = phantom_dir
    write_fod(phantom, tmp_path / "csd")
    outputs = []
    for run, seed in enumerate((4, 4, 9)):
        out = tmp_path / f"out{run}"
        run_bundles(registration=folder / "reg", output=out, fod=tmp_path / "csd", names=["CBD_R"], params=KEEP,
                    fod_params=FodProbabilisticParams(step_mm=1.0), device="cpu", seed_rng=seed)  # fmt: skip
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] == outputs[1]
    assert outputs[0]["CBD_R.trx"] != outputs[2]["CBD_R.trx"]


def test_a_cancelled_run_leaves_nothing_behind(phantom_dir, tmp_path):
    from tractlens.app.jobs import Cancelled, JobContext

    folder, _ = phantom_dir
    seen = []
    context = JobContext(
        on_progress=lambda done, total, name: (seen.append((done, total, name)), done and context.cancel())
    )
    with pytest.raises(Cancelled):
        run_bundles(registration=folder / "reg", output=tmp_path / "out", samples=folder / "bpx",
                    names=["FMI", "FMA"], params=KEEP, prob_params=PROB, device="cpu", context=context)  # fmt: skip
    assert seen[:2] == [(0, 2, "FMA"), (1, 2, "FMI")]  # per bundle, in the protocols' order; then the cancel
    assert list(tmp_path.iterdir()) == []


def test_tensor_and_fod_engines_track_the_bundles_too(phantom_dir, tmp_path):
    folder, phantom = phantom_dir
    write_tensor(phantom, tmp_path / "dti")
    write_fod(phantom, tmp_path / "csd")
    fod_params = FodProbabilisticParams(step_mm=1.0)
    for kind, data, name in (("tensor", tmp_path / "dti", "UF_L"), ("fod", tmp_path / "csd", "ILF_R")):
        out = tmp_path / f"out_{kind}"
        run_bundles(registration=folder / "reg", output=out, names=[name], params=KEEP, fod_params=fod_params,
                    device="cpu", **{kind: data})  # fmt: skip
        record = json.loads((out / "bundles.json").read_text())["bundles"][name]
        assert record["status"] == "ok", record["message"]
        tract = load_tractogram(out / f"{name}.trx")
        assert len(tract) == record["streamlines"] == record["waytotal"] > 0
        assert _inside_share(name, tract) >= 0.8, kind


def test_cli_refuses_bad_input_and_writes_nothing(phantom_dir, tmp_path, capsys):
    folder, _ = phantom_dir
    out = tmp_path / "out"
    base = ["bundles", "--samples", str(folder / "bpx"), "-o", str(out), "--device", "cpu"]
    assert main([*base, "--registration", str(tmp_path / "nowhere")]) == 2
    assert "registration" in capsys.readouterr().err
    assert main([*base, "--registration", str(folder / "reg"), "--bundles", "CST_L,XYZ"]) == 2
    assert "no bundle named 'XYZ'" in capsys.readouterr().err
    assert (
        main(["bundles", "--fod", str(tmp_path / "missing"), "--registration", str(folder / "reg"), "-o", str(out)])
        == 2
    )
    assert main(["bundles", "--registration", str(folder / "reg"), "-o", str(out)]) == 2
    assert "one of --samples, --fod, --tensor" in capsys.readouterr().err
    assert not out.exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main([*base[:-2], "--registration", str(folder / "reg"), "-o", str(tmp_path / "taken")]) == 2
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_cli_lists_the_protocols(capsys):
    assert main(["bundles", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in listed["bundles"]] == bundle_names()
    assert listed["protocols_version"] and all(row["citation"] for row in listed["bundles"])
    assert main(["bundles", "--list"]) == 0
    text = capsys.readouterr().out
    assert "CST_L" in text and "Warrington" in text


def test_cli_tracks_and_says_which_bundles_failed(phantom_dir, tmp_path, capsys):
    folder, _ = phantom_dir
    argv = ["bundles", "--samples", str(folder / "bpx"), "--registration", str(folder / "reg"), "-o",
            str(tmp_path / "out"), "--bundles", "CBD_L", "--device", "cpu", "--nsamples", "4", "--steplength", "1",
            "--nsteps", "300", "--keep-streamlines", "50", "--seed-rng", "2", "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["bundles"]["CBD_L"]["status"] == "ok" and summary["seed_rng"] == 2
    assert summary["parameters"]["keep_streamlines"] == 50
    assert (tmp_path / "out" / "CBD_L_density.nii.gz").is_file()


@pytest.mark.gpu
def test_gpu_bundles_match_the_numpy_reference(phantom_dir, tmp_path):
    """The CUDA engine against the NumPy reference, same seed: the same waytotal and the same
    density, exactly (the kernel and the reference draw the same streams and count in integers);
    the kept sample's streamlines the same count and points within 1e-3 mm (float32 steps)."""
    folder, _ = phantom_dir
    names = ["CST_R", "SLF_L", "FMI"]
    runs = {}
    for device in ("cpu", "gpu"):
        out = tmp_path / device
        run_bundles(registration=folder / "reg", output=out, samples=folder / "bpx", names=names, params=KEEP,
                    prob_params=PROB, device=device, seed_rng=11)  # fmt: skip
        runs[device] = out
    cpu, gpu = (json.loads((runs[d] / "bundles.json").read_text())["bundles"] for d in ("cpu", "gpu"))
    for name in names:
        assert gpu[name]["waytotal"] == cpu[name]["waytotal"] > 0
        assert gpu[name]["tracked"] == cpu[name]["tracked"]
        a, b = (np.asarray(nib.load(runs[d] / f"{name}_density.nii.gz").dataobj) for d in ("cpu", "gpu"))
        np.testing.assert_array_equal(a, b)
        ta, tb = (load_tractogram(runs[d] / f"{name}.trx") for d in ("cpu", "gpu"))
        assert len(ta) == len(tb)
        np.testing.assert_array_equal(ta.offsets, tb.offsets)
        np.testing.assert_allclose(ta.points_world(), tb.points_world(), atol=1e-3)


def test_regions_follow_the_registration_and_the_partial_volume_threshold():
    """A subject 12 mm to the right of and 6 mm above MNI (an affine registration): a protocol sphere
    lands where the transform sends its centre, and a stricter partial-volume threshold keeps fewer
    of its edge voxels (each set inside the looser one)."""
    from tractlens.app.bundles.masks import SubjectInMni
    from tractlens.app.bundles.phantom import MNI_2MM
    from tractlens.app.bundles.protocols import Shape
    from tractlens.app.grid import Grid
    from tractlens.app.registration import Registration

    shift = np.array([12.0, 0.0, 6.0])
    affine = np.eye(4)
    affine[:3, 3] = shift  # fixed (MNI) x -> moving (subject) x + shift
    grid_affine = np.diag([2.0, 2.0, 2.0, 1.0])
    grid_affine[:3, 3] = [-80.0, -110.0, -60.0]
    subject = Grid(grid_affine, (80, 100, 80))
    reg = Registration(MNI_2MM, subject, affine, kind="affine", fixed_name="mni", moving_name="subject",
                       template="mni", template_side="fixed")  # fmt: skip
    placed = SubjectInMni(reg, subject)
    sphere = (Shape("sphere", (-20.0, -30.0, 10.0), 7.0),)
    masks = {t: placed.region_mask(sphere, t) for t in (0.01, 0.5, 1.0)}
    centre = subject.to_mm(np.argwhere(masks[0.5])).mean(axis=0)
    np.testing.assert_allclose(centre, np.array([-20.0, -30.0, 10.0]) + shift, atol=0.5)
    volume = masks[0.5].sum() * 8.0
    assert abs(volume - 4 / 3 * np.pi * 7.0**3) < 0.15 * 4 / 3 * np.pi * 7.0**3
    assert masks[1.0].sum() < masks[0.5].sum() < masks[0.01].sum()
    assert not (masks[1.0] & ~masks[0.5]).any() and not (masks[0.5] & ~masks[0.01]).any()
    with pytest.raises(InputError, match="MNI template"):
        SubjectInMni(Registration(MNI_2MM, subject, affine), subject)


def test_a_stop_region_ends_the_streamlines_there(phantom_dir, tmp_path, monkeypatch):
    """The shipped protocols define no stop region; the engines honour one: the forceps minor with
    a stop slab at the midline, between its seed (left) and its target (right), reaches nothing."""
    import dataclasses

    from tractlens.app.bundles import run as bundles_run
    from tractlens.app.bundles.protocols import Shape

    folder, _ = phantom_dir
    midline = (Shape("box", (-3.0, -120.0, -70.0), (3.0, 90.0, 90.0)),)
    stopped = dataclasses.replace(protocol_of("FMI"), stop=midline)
    monkeypatch.setattr(bundles_run, "protocol_of", lambda name: stopped)
    run_bundles(registration=folder / "reg", output=tmp_path / "out", samples=folder / "bpx", names=["FMI"],
                params=KEEP, prob_params=PROB, device="cpu")  # fmt: skip
    record = json.loads((tmp_path / "out" / "bundles.json").read_text())["bundles"]["FMI"]
    assert record["region_voxels"]["stop"] > 0 and record["protocol"]["regions"]["stop"]
    assert record["status"] == "empty" and record["waytotal"] == 0 and record["tracked"] > 0


def _reference_fraction(placed, shape) -> np.ndarray:
    """A shape's share of each voxel as first written: (N, 3) reductions, decided at the centre away
    from the edge and at 2 x 2 x 2 points on it."""
    from tractlens.app.bundles.masks import SUB_POINTS

    p = placed.centres
    if shape.kind == "box":
        signed = np.max(np.maximum(np.asarray(shape.a) - p, p - np.asarray(shape.b)), axis=1)
    else:
        signed = np.linalg.norm(p - np.asarray(shape.a), axis=1) - float(shape.b)
    fraction = (signed <= -placed.half_diagonal).astype(np.float32)
    edge = np.flatnonzero(np.abs(signed) < placed.half_diagonal)
    points = placed.registration.to_template(placed.grid.to_mm((placed.ijk[edge][:, None] + SUB_POINTS).reshape(-1, 3)))
    fraction[edge] = shape.contains(points).reshape(len(edge), len(SUB_POINTS)).mean(axis=1)
    return fraction


def test_regions_warped_ahead_on_threads_are_those_warped_in_turn():
    """The regions of every bundle warped on worker threads ahead of need (each shape once) are
    exactly those warped one by one, and each shape's share of a voxel is the reference's, under
    an affine registration with a rotation and a stretch."""
    from concurrent.futures import ThreadPoolExecutor

    from tractlens.app.bundles.masks import SubjectInMni, protocol_masks
    from tractlens.app.bundles.phantom import BRAIN_AXES, BRAIN_CENTRE, MNI_2MM
    from tractlens.app.registration import Registration

    grid = phantom_grid(3.0)
    centres = grid.to_mm(np.indices(grid.shape).reshape(3, -1).T)
    brain = ((((centres - BRAIN_CENTRE) / BRAIN_AXES) ** 2).sum(1) <= 1.0).reshape(grid.shape)
    affine = np.eye(4)
    affine[:3, :3] = [[1.04, 0.05, 0.0], [-0.05, 0.97, 0.02], [0.0, -0.02, 1.02]]
    affine[:3, 3] = [3.3, -2.1, 1.7]
    reg = Registration(MNI_2MM, grid, affine, kind="affine", fixed_name="mni", moving_name="subject",
                       template="mni", template_side="fixed")  # fmt: skip
    ahead, in_turn = SubjectInMni(reg, grid, brain), SubjectInMni(reg, grid, brain)
    names = ["CST_L", "CST_R", "AF_L", "FMA", "OR_R"]
    with ThreadPoolExecutor(max_workers=3) as pool:
        for name in names:
            ahead.prefetch(protocol_of(name).shapes(), pool)
        for name in names:
            a = protocol_masks(protocol_of(name), ahead, brain, 0.5)
            b = protocol_masks(protocol_of(name), in_turn, brain, 0.5)
            assert a.voxels == b.voxels and a.voxels["seed"] > 0
            for x, y in zip([a.seed, *a.targets, a.exclude], [b.seed, *b.targets, b.exclude], strict=True):
                np.testing.assert_array_equal(x, y)
    for shape in protocol_of("AF_L").shapes():
        np.testing.assert_array_equal(in_turn.shape_fraction(shape), _reference_fraction(in_turn, shape))


def test_a_run_reports_each_bundles_stage_times_and_streamlines(phantom_dir, tmp_path):
    """Per bundle, the seconds of each stage and the streamlines launched and traced again, in the
    returned result only (bundles.json stays the same from run to run)."""
    folder, _ = phantom_dir
    result = run_bundles(registration=folder / "reg", output=tmp_path / "out", samples=folder / "bpx",
                         names=["CBD_L"], params=KEEP, prob_params=PROB, device="cpu", seed_rng=1)  # fmt: skip
    stages = result.bundles["CBD_L"].stages
    for key in ("regions_s", "prepare_s", "tracking_s", "retrace_s", "density_s", "write_s"):
        assert stages[key] >= 0.0, key
    assert stages["launched"] == result.bundles["CBD_L"].record["tracked"] > 0
    assert result.bundles["CBD_L"].record["streamlines"] <= stages["retraced"] <= stages["launched"]
    assert {"retrace_trace_s", "retrace_polylines_s", "retrace_to_host_s"} <= set(stages)
    assert result.summary["stages"]["CBD_L"] is stages
    assert {"total", "engine", "subject", "bundles"} <= set(result.summary["seconds"])
    written = (tmp_path / "out" / "bundles.json").read_text()
    assert not any(f'"{key}"' in written for key in ("regions_s", "tracking_s", "retrace_s", "write_s", "stages"))
