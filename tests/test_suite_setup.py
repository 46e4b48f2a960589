"""The suite's own set-up (tests/conftest.py): with pytest-xdist (``-n N``) the controller runs no
test and starts no Xvfb; every worker, and a run without workers, starts its own when there is no
display."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import _is_xdist_controller


def _config(numprocesses=None, dist="no", worker=False):
    config = SimpleNamespace(option=SimpleNamespace(numprocesses=numprocesses, dist=dist))
    if worker:
        config.workerinput = {"workerid": "gw0"}
    return config


@pytest.mark.parametrize(
    ("config", "controller"),
    [
        (_config(2, "loadfile"), True),  # -n 2 (or -n auto on two cores): hands the files out
        (_config(2, "loadfile", worker=True), False),  # a worker runs tests: it needs a display
        (_config(0, "no"), False),  # -n 0: one process runs everything
        (_config(None, "loadfile"), False),  # no -n: --dist alone distributes nothing
        (SimpleNamespace(option=SimpleNamespace()), False),  # pytest-xdist not installed
    ],
)
def test_only_the_xdist_controller_goes_without_a_display(config, controller):
    assert _is_xdist_controller(config) is controller
