"""Uncertainty envelopes (:mod:`app.envelopes`): nested levels, volumes equal to a brute-force
count, distances to a lesion equal to brute force within a voxel, the true bundle inside the
95 % envelope on phantoms, the command line and its refusals."""

from __future__ import annotations

import json
from fractions import Fraction
from itertools import pairwise

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.cli import main
from tractlens.app.envelopes import envelopes, lesion_distances, parse_levels
from tractlens.app.errors import InputError


def brute_force_envelope(paths: np.ndarray, level: float) -> np.ndarray:
    """The definition, literally: voxels one by one, most visited first (ties: smaller C index),
    until their visits reach the level's share of all visits (exact fractions)."""
    flat = paths.ravel().astype(int).tolist()
    ranked = sorted(range(len(flat)), key=lambda i: (-flat[i], i))
    need = Fraction(level) / 100 * sum(flat)
    mask, held = np.zeros(len(flat), bool), 0
    for i in ranked:
        mask[i] = True
        held += flat[i]
        if held >= need:
            break
    return mask.reshape(paths.shape)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_levels_are_nested_and_equal_the_brute_force_count(seed):
    rng = np.random.default_rng(seed)
    paths = rng.poisson(3.0, (9, 8, 7)) * (rng.random((9, 8, 7)) < 0.5)  # many ties, many zeros
    affine = np.diag([2.0, 1.5, 3.0, 1.0])
    found = envelopes(paths, affine, (50, 90, 95, 33.3))
    assert [e.level for e in found.envelopes] == [33.3, 50, 90, 95]
    for inner, outer in zip(found.envelopes, found.envelopes[1:]):
        assert not (inner.mask & ~outer.mask).any() and inner.voxels <= outer.voxels  # nested
    for envelope in found.envelopes:
        expected = brute_force_envelope(paths, envelope.level)
        assert np.array_equal(envelope.mask, expected)  # exactly, ties included
        assert envelope.voxels == int(expected.sum()) and envelope.volume_mm3 == pytest.approx(9.0 * expected.sum())
        assert envelope.share >= envelope.level / 100
        without_last = paths[envelope.mask].sum() - envelope.min_visits
        assert without_last < envelope.level / 100 * paths.sum()  # the smallest: one voxel less is too little


def test_ties_are_broken_by_the_voxel_index_the_same_way_every_time():
    paths = np.ones((4, 4, 4), dtype=int)  # all tied: the first voxels in C order
    found = envelopes(paths, np.eye(4), (50,))
    assert np.array_equal(np.flatnonzero(found.envelopes[0].mask.ravel()), np.arange(32))


def brute_force_distance(mask, affine, lesion, lesion_affine) -> float:
    a = np.argwhere(mask) @ affine[:3, :3].T + affine[:3, 3]
    b = np.argwhere(lesion) @ lesion_affine[:3, :3].T + lesion_affine[:3, 3]
    return float(np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)).min())


@pytest.mark.parametrize("seed", [0, 1])
def test_lesion_distances_match_brute_force_within_a_voxel(seed):
    rng = np.random.default_rng(seed)
    paths = np.zeros((20, 16, 12), dtype=int)
    paths[3:9, 4:10, 3:8] = rng.integers(1, 50, (6, 6, 5))
    affine = np.array([[2.0, 0, 0, -20], [0, 2.0, 0, -16], [0, 0, 2.5, -10], [0, 0, 0, 1]])
    found = envelopes(paths, affine, (50, 90, 95))
    lesion = np.zeros((30, 30, 20), bool)
    lesion[20:24, 10:14, 8:11] = True  # on another grid (1.5 mm, shifted)
    lesion_affine = np.array([[1.5, 0, 0, -22], [0, 1.5, 0, -18], [0, 0, 1.5, -12], [0, 0, 0, 1]])
    distances = lesion_distances(found, lesion, lesion_affine)
    for envelope, distance in zip(found.envelopes, distances):
        expected = brute_force_distance(envelope.mask, affine, lesion, lesion_affine)
        assert expected > 0 and distance.overlap_voxels == 0
        assert abs(distance.min_mm - expected) <= 2.5  # one (the largest) voxel size
    assert distances[0].min_mm >= distances[1].min_mm >= distances[2].min_mm  # wider envelopes come closer

    inside = np.zeros(paths.shape, bool)
    inside[np.unravel_index(np.argmax(paths), paths.shape)] = True  # in the most visited voxel: every envelope
    assert all(d.min_mm == 0 and d.overlap_voxels >= 1 for d in lesion_distances(found, inside, affine))


def test_the_95_percent_envelope_holds_the_true_bundle_on_the_straight_phantom():
    from tests.test_probabilistic import SHAPE, straight_bundle
    from tractlens.gpu.probabilistic import track
    from tractlens.gpu.probabilistic_params import ProbParams, mask_bits

    field_, brain, bundle = straight_bundle()
    truth = bundle & brain
    seeds = np.argwhere(truth)
    result = track(field_, mask_bits(brain), seeds, ProbParams(n_samples=10, n_steps=300), device="cpu")
    found = envelopes(result.paths, np.diag([2.0, 2.0, 2.0, 1.0]), (50, 90, 95))
    held = (found.envelopes[-1].mask & truth).sum() / truth.sum()
    print(f"\n95 % envelope: {found.envelopes[-1].voxels} voxels of {np.prod(SHAPE)}, holds {held:.3f} of the bundle")
    assert held >= 0.90


def test_the_95_percent_envelope_holds_the_true_bundle_on_the_demo_phantom(demo_bedpostx, demo_dir, demo_phantom):
    from tractlens.app.io import load_bedpostx
    from tractlens.app.pipelines.probabilistic import prepare_probabilistic_masks
    from tractlens.gpu.probabilistic import ProbParams

    samples = load_bedpostx(demo_bedpostx)
    seed = np.asarray(nib.load(demo_dir / "roi_crossing_lr_seed.nii.gz").dataobj) > 0
    run = prepare_probabilistic_masks(samples, seed, params=ProbParams(n_samples=100, seed=1))
    result = run.track(device="cpu")
    k = [b.name for b in demo_phantom.bundles].index("crossing_lr")
    truth = (demo_phantom.occupancy[..., k] >= 0.5) & demo_phantom.brain
    found = envelopes(result.paths, samples.affine, (50, 90, 95), waytotal=result.waytotal)
    held = [(e.mask & truth).sum() / truth.sum() for e in found.envelopes]
    print(f"\ncrossing_lr: the 50/90/95 % envelopes hold {held} of the true bundle's voxels")
    assert held[-1] >= 0.90 and held == sorted(held)


def test_bad_levels_and_an_empty_map_are_refused():
    for bad in ("0", "100", "-5", "50,150", "abc", "", "50,50"):
        with pytest.raises(InputError):
            parse_levels(bad)
    assert parse_levels("95, 50 ,90%") == (50.0, 90.0, 95.0)
    with pytest.raises(InputError, match="waytotal 0"):
        envelopes(np.zeros((3, 3, 3)), np.eye(4))
    with pytest.raises(InputError, match="waytotal 0"):
        envelopes(np.ones((3, 3, 3)), np.eye(4), waytotal=0)


def write_prob_dir(folder, paths, affine, waytotal):
    folder.mkdir()
    nib.save(nib.Nifti1Image(paths.astype(np.float32), affine), folder / "fdt_paths.nii.gz")
    (folder / "waytotal").write_text(f"{waytotal}\n")
    return folder


def test_envelopes_and_distance_commands(tmp_path, capsys):
    rng = np.random.default_rng(4)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    paths = np.zeros((12, 12, 12))
    paths[2:6, 2:6, 2:6] = rng.integers(1, 30, (4, 4, 4))
    prob = write_prob_dir(tmp_path / "prob", paths, affine, 40)
    out = tmp_path / "env"
    assert main(["envelopes", str(prob), "--levels", "50,90,95", "-o", str(out), "--json"]) == 0
    summary = json.loads((out / "envelopes.json").read_text())
    assert [entry["level"] for entry in summary["levels"]] == [50, 90, 95] and "smallest" in summary["definition"]
    for entry in summary["levels"]:
        mask = np.asarray(nib.load(out / entry["file"]).dataobj) > 0
        assert np.array_equal(mask, brute_force_envelope(paths, entry["level"])) and entry["voxels"] == mask.sum()
    lesion = np.zeros((12, 12, 12), np.uint8)
    lesion[9:11, 9:11, 9:11] = 1
    nib.save(nib.Nifti1Image(lesion, affine), tmp_path / "lesion.nii.gz")
    capsys.readouterr()
    assert main(["distance", "--envelopes", str(out), "--lesion", str(tmp_path / "lesion.nii.gz"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    levels = report["levels"]
    assert [row["level"] for row in levels] == [50, 90, 95] and "smallest region" in report["meaning"]
    for row, entry in zip(levels, summary["levels"]):
        mask = np.asarray(nib.load(out / entry["file"]).dataobj) > 0
        assert abs(row["min_mm"] - brute_force_distance(mask, affine, lesion > 0, affine)) <= 2.0


def test_envelope_commands_refuse_bad_input_and_write_nothing(tmp_path):
    affine = np.eye(4)
    prob = write_prob_dir(tmp_path / "prob", np.ones((4, 4, 4)), affine, 5)
    empty = write_prob_dir(tmp_path / "empty", np.zeros((4, 4, 4)), affine, 0)
    for args in (
        ["envelopes", str(prob), "--levels", "0,50", "-o", str(tmp_path / "a")],
        ["envelopes", str(prob), "--levels", "50,100", "-o", str(tmp_path / "b")],
        ["envelopes", str(empty), "-o", str(tmp_path / "c")],
        ["envelopes", str(tmp_path), "-o", str(tmp_path / "d")],
    ):
        assert main(args) == 2, args
        assert not (tmp_path / args[-1]).exists(), args
    assert main(["distance", "--lesion", str(prob / "fdt_paths.nii.gz")]) == 2  # neither tractogram nor envelopes


def brute_force_visitation(streamlines, shape) -> np.ndarray:
    """Per streamline, the set of voxels its quarter-voxel samples fall in; one count each."""
    visits = np.zeros(shape, dtype=int)
    for line in streamlines:
        voxels = set()
        for a, b in pairwise(line):
            n = max(1, int(np.ceil(np.abs(b - a).max() * 4)))
            for t in range(n + 1):
                v = tuple(int(c) for c in np.rint(a + (b - a) * t / n))
                if all(0 <= c < s for c, s in zip(v, shape)):
                    voxels.add(v)
        for v in voxels:
            visits[v] += 1
    return visits


def test_streamline_visitation_counts_each_streamline_once_per_voxel():
    from tractlens.app.envelopes import streamline_visitation

    rng = np.random.default_rng(3)
    shape = (12, 10, 8)
    centre = np.array([5.0, 5.0, 4.0])
    lines = [np.cumsum(rng.normal(0, 0.8, (int(rng.integers(2, 15)), 3)), axis=0) + centre for _ in range(30)]
    lines.append(np.array([[2.0, 2.0, 2.0], [2.1, 2.0, 2.0], [2.0, 2.1, 2.0]]))  # loops in one voxel: once
    offsets = np.concatenate([[0], np.cumsum([len(line) for line in lines])])
    visits = streamline_visitation(np.concatenate(lines), offsets, shape)
    assert np.array_equal(visits, brute_force_visitation(lines, shape))
    assert visits[2, 2, 2] >= 1


def test_a_bootstrap_of_jittered_runs_gives_envelopes_holding_the_true_bundle(tmp_path, capsys):
    """Ten 'runs' of a straight bundle (seeds perturbed: each run's streamlines shifted at random
    within the bundle) as tractograms: the 95 % envelope holds the bundle, the command writes it."""
    from nibabel.streamlines import Tractogram as NibTractogram
    from nibabel.streamlines import save

    shape, affine = (30, 16, 16), np.diag([2.0, 2.0, 2.0, 1.0])
    truth = np.zeros(shape, bool)
    truth[2:28, 6:10, 6:10] = True
    rng = np.random.default_rng(5)
    files = []
    for run in range(10):
        lines = []
        for _ in range(40):
            y, z = rng.uniform(5.6, 9.4, 2)
            xs = np.linspace(2, 27, 30)
            line = np.column_stack([xs, y + rng.normal(0, 0.15, 30), z + rng.normal(0, 0.15, 30)])
            lines.append((line @ affine[:3, :3].T + affine[:3, 3]).astype(np.float32))
        header = {"voxel_to_rasmm": affine, "dimensions": shape, "voxel_sizes": (2.0, 2.0, 2.0), "voxel_order": "RAS"}
        path = tmp_path / f"run{run}.trk"
        save(NibTractogram(lines, affine_to_rasmm=np.eye(4)), str(path), header=header)
        files.append(str(path))
    out = tmp_path / "env"
    assert main(["envelopes", *files, "--levels", "50,95", "-o", str(out), "--json"]) == 0
    summary = json.loads((out / "envelopes.json").read_text())
    assert summary["waytotal"] == 400 and len(summary["source"]) == 10
    e95 = np.asarray(nib.load(out / "envelope_95.nii.gz").dataobj) > 0
    e50 = np.asarray(nib.load(out / "envelope_50.nii.gz").dataobj) > 0
    assert not (e50 & ~e95).any() and (e95 & truth).sum() / truth.sum() >= 0.90
