"""tractlens batch with the steps register, bundles and profiles, and the cohort's profile table,
on a 2-subject BIDS cohort made from the MNI template (tests/cohort_synth.py).

Bundle tracking is another branch's (the named-bundles use case): here ``run_bundles`` is replaced
by a stand-in that writes a bundles folder with the interface's layout, so what is tested is the
batch's wiring (the register → bundles → profiles chain, the inputs each step is given, the
cohort table), with the tractometry's values checked by hand: every subject's tensor is the same
everywhere in the head, so its FA profile is the FA of that tensor. The workers are threads of
this process (an in-process Dask cluster), so that the stand-in is the one they call.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed", reason="the batch extra (dask[distributed]) is part of the test extra")
pytest.importorskip("bids", reason="the batch extra (pybids) is part of the test extra")
pytest.importorskip("dipy", reason="the anatomy extra (register) is part of the test extra")

from tractlens.app.batch.dataset import Series
from tractlens.app.batch.steps import STEPS, parse_steps, step_argv
from tractlens.app.cli import main
from tractlens.app.tractometry import TIDY_COLUMNS, profile_bundles
from tractlens.app.tractometry_table import read_profiles
from tractlens.gpu.tractometry import ProfileParams

from .bundles_synth import write_bundles_folder
from .cohort_synth import callosal_streamlines, fractional_anisotropy, make_cohort

LAMBDAS = {"01": 1.5e-3, "02": 1.1e-3}
POINTS = 10


def test_the_steps_run_in_the_issue_s_order_and_register_is_syn_by_default(tmp_path):
    assert parse_steps("profiles,bundles,register,fit-ballstick,fit-dti") == [
        "fit-dti", "fit-ballstick", "register", "bundles", "profiles"]  # fmt: skip
    series = Series("01", "pre", tmp_path / "sub-01_ses-pre_dwi.nii.gz", None, None)
    argv = step_argv("register", series, {}, {}, "cpu")
    assert argv[:4] == ["register", str(series.dwi), "mni", "--type"] and argv[4] == "syn"
    chosen = step_argv("register", series, {}, {"type": "affine"}, "cpu")
    assert chosen.count("--type") == 1 and chosen[chosen.index("--type") + 1] == "affine"
    inputs = {"bundles": tmp_path / "b", **{m: tmp_path / f"{m}.nii.gz" for m in ("fa", "md", "ad", "rd")}}
    argv = step_argv("profiles", series, inputs, {}, "cpu")
    assert argv[argv.index("--subject") + 1] == "sub-01" and argv[argv.index("--session") + 1] == "ses-pre"
    assert f"FA={tmp_path / 'fa.nii.gz'}" in argv and STEPS["bundles"].needs == ("fit-ballstick", "register")


def test_cohort_table_keeps_earlier_subjects_and_names_this_run_s_missing_ones(tmp_path):
    from tractlens.app.batch.cohort import COHORT_TABLE, write_cohort_profiles
    from tractlens.app.batch.naming import sidecar_of
    from tractlens.app.batch.plan import Plan
    from tractlens.app.batch.task import StepJob
    from tractlens.app.tractometry_table import tidy_csv_text

    derivatives = tmp_path / "deriv"
    jobs = []
    for subject, sidecar in (("01", True), ("02", True), ("03", True), ("04", False)):
        folder = derivatives / f"sub-{subject}" / "dwi"
        folder.mkdir(parents=True)
        name = STEPS["profiles"].primary(f"sub-{subject}", {})["profiles"]
        (folder / name).write_text(tidy_csv_text([(f"sub-{subject}", "", "CST_L", 0, "FA", 0.5)]))
        if sidecar:
            sidecar_of(folder / name).write_text("{}")
        if subject in ("01", "02"):  # this run's subjects; 03 done by an earlier run, 04 left half-done
            jobs.append(StepJob("profiles", f"sub-{subject}", (), {}, str(folder), (name,)))
    results = [{"step": "profiles", "subject": "sub-01", "status": "done"},
               {"step": "profiles", "subject": "sub-02", "status": "failed"}]  # fmt: skip
    info = write_cohort_profiles(Plan(jobs, [[], []], ["profiles"], []), results, derivatives)
    assert info["subjects"] == ["sub-01", "sub-03"] and info["missing"] == ["sub-02"]
    assert [r[0] for r in read_profiles(derivatives / COHORT_TABLE)] == ["sub-01", "sub-03"]
    sidecar = json.loads((derivatives / COHORT_TABLE).with_suffix(".json").read_text())
    assert sidecar["WithoutProfiles"] == ["sub-02"]
    assert write_cohort_profiles(Plan([], [], ["fit-dti"], []), [], derivatives) is None  # no profiles step


@pytest.fixture
def stand_in(monkeypatch):
    """``tractlens.app.bundles.run_bundles`` replaced by a stand-in (the module itself is made up
    while the named-bundles branch is not merged); returns the calls it received."""
    calls = []

    def run_bundles(*, registration, output, samples=None, fod=None, tensor=None, names=None, params=None,
                    device="auto", seed_rng=None, context=None):  # fmt: skip
        calls.append({"registration": Path(registration), "samples": samples, "names": names, "seed_rng": seed_rng})
        assert (Path(registration) / "registration.json").is_file() and (Path(samples) / "marker.txt").is_file()
        import nibabel as nib

        affine = nib.load(str(Path(samples) / "nodif_brain_mask.nii.gz")).affine
        shape = nib.load(str(Path(samples) / "nodif_brain_mask.nii.gz")).shape
        write_bundles_folder(Path(output), {"CST_L": callosal_streamlines(affine), "AF_R": [], "UF_L": None},
                             affine=affine, shape=shape)  # fmt: skip
        return types.SimpleNamespace(summary={"engine": "stand-in"})

    try:
        module = importlib.import_module("tractlens.app.bundles")
        monkeypatch.setattr(module, "run_bundles", run_bundles)
    except ImportError:
        monkeypatch.setitem(sys.modules, "tractlens.app.bundles", types.SimpleNamespace(run_bundles=run_bundles))
    return calls


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    # one thread: the steps swap sys.stdout to read their summaries (a worker process runs one at a time)
    cluster = LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)
    with Client(cluster) as c:
        yield c
    cluster.close()


def _fake_ballstick(derivatives: Path, bids: Path, subject: str) -> None:
    """fit-ballstick's folder as an earlier run left it (the stand-in reads only its mask)."""
    import nibabel as nib

    folder = derivatives / f"sub-{subject}" / "dwi" / STEPS["fit-ballstick"].primary(f"sub-{subject}", {})["samples"]
    folder.mkdir(parents=True)
    image = nib.load(str(bids / f"sub-{subject}" / "dwi" / f"sub-{subject}_dwi.nii.gz"))
    nib.save(nib.Nifti1Image(np.ones(image.shape[:3], np.uint8), image.affine), folder / "nodif_brain_mask.nii.gz")
    (folder / "marker.txt").write_text("stand-in samples")


@pytest.mark.slow
def test_batch_register_bundles_profiles_writes_one_cohort_table(tmp_path, client, stand_in, capsys):
    bids = make_cohort(tmp_path / "bids", LAMBDAS)
    derivatives = tmp_path / "derivatives"
    for subject in LAMBDAS:
        _fake_ballstick(derivatives, bids, subject)
    config = tmp_path / "params.toml"
    config.write_text(f'[register]\ntype = "rigid"\n[bundles]\nbundles = "CST_L,AF_R,UF_L"\nseed-rng = 3\n'
                      f"[profiles]\npoints = {POINTS}\n")  # fmt: skip
    code = main(["batch", str(bids), "-o", str(derivatives), "--pipeline", "fit-dti,register,bundles,profiles",
                 "--config", str(config), "--scheduler", client.scheduler.address, "--json", "--quiet"])  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 0, json.dumps(summary["failed"], indent=1)
    assert len(stand_in) == 2 and all(c["names"] == ["CST_L", "AF_R", "UF_L"] and c["seed_rng"] == 3 for c in stand_in)
    cohort = derivatives / "tractometry_profiles.csv"
    assert summary["cohort_profiles"]["output"] == str(cohort)
    assert summary["cohort_profiles"]["subjects"] == ["sub-01", "sub-02"]
    assert cohort.read_text().splitlines()[0] == ",".join(TIDY_COLUMNS)
    rows = read_profiles(cohort)
    assert len(rows) == 2 * 3 * 4 * POINTS  # subjects × bundles × metrics × nodes
    for subject, l1 in LAMBDAS.items():
        fa = np.array([r[5] for r in rows if r[0] == f"sub-{subject}" and r[2] == "CST_L" and r[4] == "FA"])
        np.testing.assert_allclose(fa, fractional_anisotropy(l1), atol=1e-4)  # the subject's tensor, by hand
        md = np.array([r[5] for r in rows if r[0] == f"sub-{subject}" and r[2] == "CST_L" and r[4] == "MD"])
        np.testing.assert_allclose(md, (l1 + 0.8e-3) / 3, rtol=1e-3)
        # the same as the use case on the subject's derivatives
        folder = derivatives / f"sub-{subject}" / "dwi"
        bundles = folder / STEPS["bundles"].primary(f"sub-{subject}", {})["bundles"]
        fa_map = folder / STEPS["fit-dti"].primary(f"sub-{subject}", {})["fa"]
        direct = profile_bundles(bundles, {"FA": fa_map}, params=ProfileParams(n_points=POINTS), device="cpu")
        np.testing.assert_allclose(fa, direct.values[("CST_L", "FA")], rtol=1e-6)
        sidecar = json.loads((folder / STEPS["bundles"].primary(f"sub-{subject}", {})["bundles"]).with_name(
            f"{bundles.name}.json").read_text())  # fmt: skip
        assert sidecar["Parameters"]["BundlesStep"] == {"bundles": ["CST_L", "AF_R", "UF_L"], "seed_rng": 3}
    assert all(np.isnan(r[5]) for r in rows if r[2] in ("AF_R", "UF_L"))  # kept, empty
    assert {r[1] for r in rows} == {""}
    pandas = pytest.importorskip("pandas")
    frame = pandas.read_csv(cohort)
    assert list(frame.columns) == list(TIDY_COLUMNS) and frame.groupby("subject").size().tolist() == [120, 120]
