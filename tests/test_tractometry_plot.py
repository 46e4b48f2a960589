"""Profile figures (issue 39): per bundle the cohort's mean ± sd and each subject thin, from a
tidy table; the drawn mean is the table's mean."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tractlens.app.cli import main
from tractlens.app.errors import InputError
from tractlens.app.tractometry_plot import BAND_GID, MEAN_GID, SUBJECT_GID, plot_profiles
from tractlens.app.tractometry_table import tidy_csv_text

pytest.importorskip("matplotlib", reason="matplotlib is in the test extra (the plot extra)")
pandas = pytest.importorskip("pandas", reason="pandas is in the test extra (the plot extra)")

K = 8


@pytest.fixture
def cohort_csv(tmp_path):
    rng = np.random.default_rng(3)
    rows = []
    for subject in ("sub-01", "sub-02", "sub-03"):
        for bundle, base in (("CST_L", 0.5), ("AF_R", 0.4), ("UF_L", 0.3)):
            for metric, scale in (("FA", 1.0), ("MD", 1e-3)):
                for node in range(K):
                    value = np.nan if (subject, bundle, node) == ("sub-03", "AF_R", 2) else base + rng.normal(0, 0.05)
                    rows.append((subject, "ses-1", bundle, node, metric, value * scale))
    path = tmp_path / "cohort.csv"
    path.write_text(tidy_csv_text(rows))
    return path


def _lines(axis, gid):
    return [line for line in axis.get_lines() if (line.get_gid() or "").startswith(gid)]


def test_figure_has_a_panel_per_bundle_and_the_mean_line_is_the_table_mean(cohort_csv):
    figure = plot_profiles(cohort_csv, metric="FA", bundles=["CST_L", "AF_R"])
    assert len(figure.axes) == 2
    frame = pandas.read_csv(cohort_csv)
    for axis, bundle in zip(figure.axes, ["CST_L", "AF_R"]):
        assert axis.get_title().startswith(bundle) and axis.get_ylabel() == "FA"
        (mean_line,) = _lines(axis, MEAN_GID)
        part = frame[(frame["bundle"] == bundle) & (frame["metric"] == "FA")]
        expected = part.groupby("node")["value"].mean()
        np.testing.assert_allclose(mean_line.get_xdata(), expected.index)
        np.testing.assert_allclose(mean_line.get_ydata(), expected.to_numpy(), rtol=1e-12)
        assert len(_lines(axis, SUBJECT_GID)) == 3  # each subject thin
        band = [c for c in axis.collections if c.get_gid() == BAND_GID]
        assert len(band) == 1
        sd = part.groupby("node")["value"].std(ddof=1).to_numpy()
        top = band[0].get_paths()[0].vertices[:, 1].max()
        assert top == pytest.approx(np.nanmax(expected.to_numpy() + sd), rel=1e-9)


def test_on_a_given_axes_every_bundle_shares_it(cohort_csv):
    from matplotlib.figure import Figure

    figure = Figure()
    ax = figure.add_subplot()
    assert plot_profiles(cohort_csv, metric="MD", ax=ax) is figure
    assert len(_lines(ax, MEAN_GID)) == 3 and ax.get_legend() is not None


def test_plot_command_writes_the_figure(cohort_csv, tmp_path, capsys):
    out = tmp_path / "profiles.png"
    code = main(["plot-profiles", str(cohort_csv), "-o", str(out), "--measure", "MD", "--bundles", "UF_L", "--json"])
    assert code == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    info = json.loads(capsys.readouterr().out)
    assert info["metric"] == "MD" and info["bundles"] == ["UF_L"] and info["subjects"] == 3
    assert main(["plot-profiles", str(cohort_csv), "-o", str(tmp_path / "x.png"), "--measure", "NDI"]) == 2
    assert not (tmp_path / "x.png").exists()
    assert main(["plot-profiles", str(cohort_csv), "-o", str(tmp_path / "x.gif")]) == 2


def test_bad_tables_are_named(tmp_path, cohort_csv):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="no column subject"):
        plot_profiles(bad)
    with pytest.raises(InputError, match="no bundle CST_R with FA"):
        plot_profiles(cohort_csv, bundles=["CST_R"])


def test_without_matplotlib_the_message_names_the_plot_extra(cohort_csv, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(InputError, match=r"the plot extra \(matplotlib is missing\).*tractlens\[plot\]"):
        plot_profiles(cohort_csv)
