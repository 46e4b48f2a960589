"""The whole cohort chain of issue 39 with nothing replaced:
``tractlens batch --pipeline fit-dti,fit-ballstick,register,bundles,profiles`` on a 2-subject BIDS
cohort made from the MNI template (tests/cohort_synth.py), then ``plot-profiles`` on its table.

NEEDS THE NAMED-BUNDLES BRANCH (bundles39): the bundles step calls
``tractlens.app.bundles.run_bundles``. While that module cannot be imported this test is marked
xfail (not run), with the import error as its reason; once it can, the test runs and must pass.
The tracking itself is the other branch's to validate: here every subject's tensor is the same in
the whole head, so wherever a bundle was found its FA profile is that tensor's FA, and a bundle
that was not found keeps its rows with empty values and says why in bundles.json.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("distributed", reason="the batch extra (dask[distributed]) is part of the test extra")
pytest.importorskip("bids", reason="the batch extra (pybids) is part of the test extra")
pytest.importorskip("dipy", reason="the anatomy extra (register) is part of the test extra")

from tractlens.app.cli import main
from tractlens.app.tractometry import TIDY_COLUMNS
from tractlens.app.tractometry_table import read_profiles

from .cohort_synth import fractional_anisotropy, make_cohort

try:
    import tractlens.app.bundles as named_bundles

    MISSING = ""
except ImportError as exc:  # only this: the module of the other branch is not there yet
    named_bundles, MISSING = None, f"{type(exc).__name__}: {exc}"

pytestmark = pytest.mark.xfail(
    named_bundles is None,
    reason=f"tractlens.app.bundles cannot be imported ({MISSING}): the named-bundles branch bundles39 is not "
    "merged; this test runs (and must pass) once it is",
    strict=False,
    run=False,
)

LAMBDAS = {"01": 1.5e-3, "02": 1.2e-3}
POINTS = 20


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
    with Client(cluster) as c:
        yield c
    cluster.close()


@pytest.mark.slow
def test_batch_chain_writes_the_cohort_profiles_and_the_plot_draws_them(tmp_path, client, capsys):
    bids = make_cohort(tmp_path / "bids", LAMBDAS)
    derivatives = tmp_path / "derivatives"
    names = named_bundles.bundle_names()[:3]
    config = tmp_path / "params.toml"
    config.write_text(
        "[fit-ballstick]\nnfibres = 1\nburnin = 20\nnjumps = 40\nsampleevery = 10\n"
        # the step's SyN (its default) diverges on this 6-mm b=0 made from the template (mutual
        # information 1.19 → 0.11, refused); affine registers it (1.19 → 1.24)
        '[register]\ntype = "affine"\n'
        f'[bundles]\nbundles = "{",".join(names)}"\nseed-rng = 1\n[profiles]\npoints = {POINTS}\n'
    )
    code = main(["batch", str(bids), "-o", str(derivatives), "--pipeline", "fit-dti,fit-ballstick,register,bundles,profiles",
                 "--config", str(config), "--scheduler", client.scheduler.address, "--json"])  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 0, json.dumps(summary["failed"], indent=1)
    cohort = derivatives / "tractometry_profiles.csv"
    assert summary["cohort_profiles"]["output"] == str(cohort)
    assert cohort.read_text().splitlines()[0] == ",".join(TIDY_COLUMNS)
    rows = read_profiles(cohort)
    assert {r[0] for r in rows} == {"sub-01", "sub-02"} and {r[2] for r in rows} == set(names)
    assert {r[4] for r in rows} == {"FA", "MD", "AD", "RD"} and {r[3] for r in rows} == set(range(POINTS))
    assert len(rows) == 2 * len(names) * 4 * POINTS
    for subject, l1 in LAMBDAS.items():
        manifest = json.loads(next((derivatives / f"sub-{subject}").rglob("bundles.json")).read_text())
        for name in names:
            status = manifest["bundles"][name]["status"]
            values = np.array([r[5] for r in rows if r[0] == f"sub-{subject}" and r[2] == name and r[4] == "FA"])
            if status == "ok" and manifest["bundles"][name]["streamlines"] > 0:
                finite = values[np.isfinite(values)]
                assert len(finite) > 0, name
                np.testing.assert_allclose(finite, fractional_anisotropy(l1), atol=2e-3)
            else:  # not found: kept, empty, and bundles.json says why
                assert np.isnan(values).all() and manifest["bundles"][name]["message"], name
    figure = tmp_path / "fa.png"
    assert main(["plot-profiles", str(cohort), "-o", str(figure), "--measure", "FA", "--quiet"]) == 0
    assert figure.read_bytes()[:4] == b"\x89PNG"
