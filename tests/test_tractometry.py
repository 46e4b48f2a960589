"""Tractometry (issue 39, part 3): tract profiles of a bundles folder for several maps as the tidy
table, checked by hand on straight synthetic bundles and against DIPY's afq_profile (pyAFQ's
profile) for the weighting. The bundles folder is written by hand with the interface's layout."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from tractlens.app.cli import main
from tractlens.app.errors import InputError
from tractlens.app.tractometry import TIDY_COLUMNS, bids_entities, collect_maps, profile_bundles
from tractlens.app.tractometry_table import concatenate_profiles, read_profiles
from tractlens.gpu import tractometry as tm
from tractlens.gpu.tractometry import ProfileParams

from .bundles_synth import AFFINE, SHAPE, linear_in_x, save_map, straight_bundle, write_bundles_folder

K = 20


@pytest.fixture
def rng():
    return np.random.default_rng(39)


@pytest.fixture
def folder(tmp_path, rng):
    bundles = {
        "CST_L": straight_bundle(rng, x=(5.0, 30.0), reverse=(1, 4, 7)),
        "AF_R": straight_bundle(rng, x=(8.0, 20.0), centre=(5.0, 5.0)),
        "UF_L": None,  # regions missed: no file
        "FMA": [],  # tracked, nothing kept
    }
    write_bundles_folder(tmp_path / "sub-07" / "ses-pre" / "bundles", bundles)
    save_map(tmp_path / "FA.nii.gz", linear_in_x())
    save_map(tmp_path / "MD.nii.gz", np.full(SHAPE, 7e-4, np.float32))
    return tmp_path / "sub-07" / "ses-pre" / "bundles"


def _expected_linear(x0_vox, x1_vox, k=K, a=0.2, b=0.01):
    return a + b * AFFINE[0, 0] * np.linspace(x0_vox, x1_vox, k)  # nodes run towards +x (left → right)


def test_tidy_csv_has_the_columns_and_a_linear_profile_from_a_linear_map(folder, tmp_path, capsys):
    out = tmp_path / "profiles.csv"
    code = main(["profile", "--bundles", str(folder), "--map", f"FA={tmp_path / 'FA.nii.gz'}",
                 "--map", f"MD={tmp_path / 'MD.nii.gz'}", "--points", str(K), "--device", "cpu", "-o", str(out)])  # fmt: skip
    assert code == 0
    with out.open() as handle:
        rows = list(csv.reader(handle))
    assert tuple(rows[0]) == TIDY_COLUMNS
    assert len(rows) == 1 + 4 * 2 * K  # every bundle × metric × node, empty bundles included
    table = read_profiles(out)
    assert {r[0] for r in table} == {"sub-07"} and {r[1] for r in table} == {"ses-pre"}
    fa = np.array([r[5] for r in table if r[2] == "CST_L" and r[4] == "FA"])
    np.testing.assert_allclose(fa, _expected_linear(5.0, 30.0), atol=2e-6)
    assert [r[3] for r in table if r[2] == "CST_L" and r[4] == "FA"] == list(range(K))
    af = np.array([r[5] for r in table if r[2] == "AF_R" and r[4] == "FA"])
    np.testing.assert_allclose(af, _expected_linear(8.0, 20.0), atol=2e-6)
    md = np.array([r[5] for r in table if r[2] == "CST_L" and r[4] == "MD"])
    np.testing.assert_allclose(md, 7e-4, rtol=1e-6)
    for empty in ("UF_L", "FMA"):  # rows kept, values empty, named in the message
        assert all(np.isnan(r[5]) for r in table if r[2] == empty)
    said = capsys.readouterr().out
    assert "profiles of 2 of 4 bundles" in said and "empty: UF_L (regions-missed), FMA (empty)" in said


def test_pandas_reads_the_table_as_is(folder, tmp_path):
    pandas = pytest.importorskip("pandas", reason="pandas is in the test extra (the plot extra)")
    out = tmp_path / "p.csv"
    main(["profile", "--bundles", str(folder), "--fit", str(_fit_folder(tmp_path)), "--points", "10",
          "--device", "cpu", "-o", str(out), "--quiet"])  # fmt: skip
    frame = pandas.read_csv(out)
    assert list(frame.columns) == list(TIDY_COLUMNS)
    assert set(frame["subject"]) == {"sub-07"} and frame["node"].dtype.kind == "i"  # text, not a number
    assert sorted(frame["metric"].unique()) == ["FA", "MD"]  # the fit folder's maps, mask left out
    assert frame.loc[frame["bundle"] == "UF_L", "value"].isna().all()


def _fit_folder(tmp_path):
    fit = tmp_path / "dti"
    fit.mkdir(exist_ok=True)
    save_map(fit / "dti_FA.nii.gz", linear_in_x())
    save_map(fit / "dti_MD.nii.gz", np.full(SHAPE, 7e-4))
    save_map(fit / "dti_mask.nii.gz", np.ones(SHAPE))
    save_map(fit / "dti_V1.nii.gz", np.zeros((*SHAPE, 3)))
    return fit


def test_streamlines_either_way_round_give_the_same_profile_and_are_counted(folder, tmp_path):
    result = profile_bundles(folder, {"FA": tmp_path / "FA.nii.gz"}, params=ProfileParams(n_points=K), device="cpu")
    assert result.bundles["CST_L"]["flipped"] == 3  # those written backwards (index 1, 4, 7)
    assert result.bundles["AF_R"]["flipped"] == 0
    np.testing.assert_allclose(result.values[("CST_L", "FA")], _expected_linear(5.0, 30.0), atol=2e-6)
    nodes = tm.resample(np.array([[0, 0, 0], [10, 0, 0], [10, 0, 0], [0, 0, 0]], float), np.array([0, 2, 4]), 5)
    flipped = tm.orient(nodes)
    assert flipped.tolist() == [False, True]  # flipped to the first, then the bundle runs towards +x


def test_gaussian_weighting_equals_dipy_afq_profile(tmp_path):
    """pyAFQ's profile is DIPY's afq_profile with gaussian_weights; with the streamlines' node
    coordinates uncorrelated (a symmetric cross-section) DIPY's covariance and ours are the same."""
    dsa = pytest.importorskip("dipy.stats.analysis", reason="DIPY is in the test extra")
    # pairs opposite about the core, each pair with its own shift along x: the coordinates are
    # uncorrelated at every node (and not degenerate, which DIPY's inverse would refuse)
    pairs = [((1, 1), 0.3), ((1, -1), -0.2), ((0, 3), 0.1), ((3, 0), -0.2)]
    lines = [
        np.stack([np.linspace(5, 30, 26) + shift, np.full(26, 8 + sign * dy), np.full(26, 6 + sign * dz)], 1)
        for (dy, dz), shift in pairs
        for sign in (1, -1)
    ]
    values = np.zeros(SHAPE, np.float32)
    grid = np.indices(SHAPE).astype(np.float32)
    values[:] = 0.3 + 0.05 * (grid[1] - 8) ** 2 + 0.01 * grid[0]  # far streamlines see larger values
    write_bundles_folder(tmp_path / "b", {"X": lines})
    save_map(tmp_path / "v.nii.gz", values)
    ours = profile_bundles(tmp_path / "b", {"v": tmp_path / "v.nii.gz"}, params=ProfileParams(n_points=K),
                           device="cpu").values[("X", "v")]  # fmt: skip
    from dipy.tracking.streamline import Streamlines

    mm = Streamlines([line @ AFFINE[:3, :3].T for line in lines])
    theirs = dsa.afq_profile(values, mm, AFFINE, n_points=K, weights=dsa.gaussian_weights(mm, n_points=K))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    plain = profile_bundles(tmp_path / "b", {"v": tmp_path / "v.nii.gz"},
                            params=ProfileParams(n_points=K, weighting="none"), device="cpu").values[("X", "v")]  # fmt: skip
    np.testing.assert_allclose(plain, dsa.afq_profile(values, mm, AFFINE, n_points=K), rtol=1e-5)
    assert np.all(plain > ours + 1e-3)  # the weighting matters here: far streamlines count less


def test_weights_by_hand():
    # one node, four streamlines on a line in y at -1, 1, -3, 3 around the core: covariance in y
    # is (1 + 1 + 9 + 9) / 4 = 5, Mahalanobis distances 1/√5, 1/√5, 3/√5, 3/√5 → weights ∝ 3, 3, 1, 1
    y = np.array([-1.0, 1.0, -3.0, 3.0])
    nodes = np.zeros((4, 2, 3))
    nodes[:, :, 1] = y[:, None]
    nodes[:, 1, 0] = 10.0
    weights = tm.node_weights(nodes, "gaussian")
    np.testing.assert_allclose(weights[:, 0], [3 / 8, 3 / 8, 1 / 8, 1 / 8])
    np.testing.assert_allclose(tm.node_weights(nodes, "none"), 0.25)
    same = np.zeros((3, 2, 3))  # every streamline at the same place: equal weights
    np.testing.assert_allclose(tm.node_weights(same, "gaussian"), 1 / 3)
    values = np.array([[1.0, np.nan], [2.0, 4.0], [3.0, 5.0], [4.0, 6.0]])
    mean, sd, n = tm.weighted_profile(values, np.full((4, 2), 0.25))
    np.testing.assert_allclose(mean, [2.5, 5.0])
    np.testing.assert_allclose(sd, [np.std([1, 2, 3, 4], ddof=1), 1.0])
    assert n.tolist() == [4, 3]


def test_a_map_on_another_grid_is_sampled_through_ras_mm(folder, tmp_path):
    other = np.array([[1.0, 0, 0, -7.3], [0, 1.25, 0, 3.1], [0, 0, 1.5, -2.0], [0, 0, 0, 1]])  # other voxels, origin
    shape = (90, 30, 20)
    save_map(tmp_path / "FA_fine.nii.gz", linear_in_x(shape, other), other)
    result = profile_bundles(folder, {"FA": tmp_path / "FA_fine.nii.gz"}, names=["CST_L"],
                             params=ProfileParams(n_points=K), device="cpu")  # fmt: skip
    np.testing.assert_allclose(result.values[("CST_L", "FA")], _expected_linear(5.0, 30.0), atol=2e-6)


def test_a_map_that_does_not_overlap_is_refused_and_nothing_is_written(folder, tmp_path, capsys):
    far = AFFINE.copy()
    far[:3, 3] = 500.0
    save_map(tmp_path / "elsewhere.nii.gz", linear_in_x(), far)
    with pytest.raises(InputError, match="the map FA does not overlap the bundles"):
        profile_bundles(folder, {"FA": tmp_path / "elsewhere.nii.gz"}, device="cpu")
    out = tmp_path / "p.csv"
    code = main(["profile", "--bundles", str(folder), "--map", f"FA={tmp_path / 'elsewhere.nii.gz'}",
                 "--device", "cpu", "-o", str(out)])  # fmt: skip
    assert code == 2 and not out.exists()
    assert "does not overlap" in capsys.readouterr().err


def test_bad_inputs_are_named(folder, tmp_path):
    fa = tmp_path / "FA.nii.gz"
    with pytest.raises(InputError, match=r"no bundle CST_R in this folder.*Choose among: CST_L, AF_R"):
        profile_bundles(folder, [str(fa)], names=["CST_R"])
    with pytest.raises(InputError, match=r"bundles\.json is missing"):
        profile_bundles(tmp_path, [str(fa)])
    with pytest.raises(InputError, match="two maps are named FA"):
        collect_maps([f"FA={fa}", f"FA={tmp_path / 'MD.nii.gz'}"])
    with pytest.raises(InputError, match="no map to profile"):
        collect_maps([])
    save_map(tmp_path / "four.nii.gz", np.zeros((*SHAPE, 2)))
    with pytest.raises(InputError, match="3-D scalar image"):
        profile_bundles(folder, [str(tmp_path / "four.nii.gz")])
    manifest = json.loads((folder / "bundles.json").read_text())
    (folder / "CST_L.trx").unlink()
    with pytest.raises(InputError, match="the tractogram of bundle CST_L is missing"):
        profile_bundles(folder, [str(fa)])
    (folder / "bundles.json").write_text(json.dumps({**manifest, "version": 9}))
    with pytest.raises(InputError, match="version 9"):
        profile_bundles(folder, [str(fa)])


def test_names_json_output_and_options(folder, tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--bundles", str(folder), "--names", "AF_R,UF_L", "--map", str(tmp_path / "FA.nii.gz"),
                 "--map", str(tmp_path / "MD.nii.gz"), "--subject", "sub-x", "--session", "", "--points", "5",
                 "--device", "cpu", "-o", str(out), "--json"])  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())
    assert data["columns"] == list(TIDY_COLUMNS) and len(data["rows"]) == 2 * 2 * 5
    assert data["bundles"]["UF_L"]["status"] == "regions-missed" and data["bundles"]["AF_R"]["streamlines"] == 12
    assert {r["subject"] for r in data["rows"]} == {"sub-x"} and {r["session"] for r in data["rows"]} == {""}
    assert all(r["value"] is None for r in data["rows"] if r["bundle"] == "UF_L")
    summary = json.loads(capsys.readouterr().out)
    assert summary["bundles"]["AF_R"]["status"] == "ok" and summary["weighting"] == "gaussian"


def test_single_bundle_form_keeps_its_csv_and_a_named_map_gives_the_tidy_one(folder, tmp_path):
    out = tmp_path / "single.csv"
    assert main(["profile", str(folder / "CST_L.trx"), "--map", str(tmp_path / "FA.nii.gz"), "--points", "7",
                 "--device", "cpu", "-o", str(out), "--quiet"]) == 0  # fmt: skip
    lines = out.read_text().splitlines()
    assert lines[0] == "point,position,FA_mean,FA_sd,n,x_mm,y_mm,z_mm" and len(lines) == 8
    np.testing.assert_allclose([float(line.split(",")[2]) for line in lines[1:]], _expected_linear(5, 30, 7), atol=1e-5)
    tidy = tmp_path / "tidy.csv"
    assert main(["profile", str(folder / "CST_L.trx"), "--map", f"FA={tmp_path / 'FA.nii.gz'}", "--points", "7",
                 "--device", "cpu", "-o", str(tidy), "--quiet"]) == 0  # fmt: skip
    rows = read_profiles(tidy)
    assert {r[2] for r in rows} == {"CST_L"} and rows[0][:2] == ("sub-07", "ses-pre")
    assert main(["profile", "--map", "x.nii.gz", "-o", str(tmp_path / "n.csv")]) == 2  # neither source


def test_bids_entities_and_cohort_concatenation(folder, tmp_path):
    assert bids_entities(tmp_path / "d" / "sub-01" / "ses-2" / "x.csv") == ("sub-01", "ses-2")
    assert bids_entities(tmp_path / "sub-02_dwi.nii.gz") == ("sub-02", "")
    tables = []
    for subject in ("sub-01", "sub-02"):
        result = profile_bundles(folder, {"FA": tmp_path / "FA.nii.gz"}, subject=subject, session="",
                                 params=ProfileParams(n_points=4), device="cpu")  # fmt: skip
        from tractlens.app.tractometry_table import write_profiles

        tables.append(write_profiles(result, tmp_path / f"{subject}.csv"))
    info = concatenate_profiles(tables, tmp_path / "cohort.csv")
    rows = read_profiles(tmp_path / "cohort.csv")
    assert info["rows"] == len(rows) == 2 * 4 * 4 and info["subjects"] == ["sub-01", "sub-02"]
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="not a tidy profile table"):
        concatenate_profiles([bad], tmp_path / "c2.csv")


@pytest.mark.gpu
def test_gpu_profiles_equal_the_cpu_ones(folder, tmp_path):
    """The same table on CuPy as on NumPy: the geometry is on the host, the trilinear samples in
    float32 on either device (relative 1e-6), empty bundles empty on both."""
    maps = {"FA": tmp_path / "FA.nii.gz", "MD": tmp_path / "MD.nii.gz"}
    cpu = profile_bundles(folder, maps, params=ProfileParams(n_points=K), device="cpu")
    gpu = profile_bundles(folder, maps, params=ProfileParams(n_points=K), device="gpu")
    assert gpu.bundles["CST_L"]["device"].startswith("gpu")
    for key, values in cpu.values.items():
        np.testing.assert_allclose(gpu.values[key], values, rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(gpu.values[("CST_L", "FA")], _expected_linear(5.0, 30.0), atol=2e-6)
