"""The plain job protocol of app (app/jobs.py): what a use case sees of whoever runs it, with no Qt."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.fiber_cache import FiberArrayCache
from tractlens.app.jobs import Cancelled, JobContext, describe_error
from tractlens.app.model import Layer, Tractogram


def test_a_context_without_callbacks_is_silent_and_not_cancelled():
    ctx = JobContext()
    ctx.progress(1, 2, "half")
    ctx.partial(object())
    assert not ctx.cancelled()
    ctx.check()  # does not raise


def test_a_context_passes_progress_and_partials_on_and_stops_when_cancelled():
    seen, event = [], threading.Event()
    ctx = JobContext(on_progress=lambda *a: seen.append(("progress", *a)), on_partial=lambda r: seen.append(r),
                     cancel_event=event)  # fmt: skip
    ctx.progress(np.int64(3), 4.0, "batch 3")
    ctx.partial("part")
    assert seen == [("progress", 3, 4, "batch 3"), "part"] and type(seen[0][1]) is int
    event.set()
    assert ctx.cancelled()
    with pytest.raises(Cancelled):
        ctx.check()
    own = JobContext()
    own.cancel()
    assert own.cancel_event.is_set() and own.cancelled()


def test_errors_become_messages():
    assert describe_error(InputError("bad", fix="Fix it")) == ("bad. Fix it.", "")
    try:
        raise KeyError("x")
    except KeyError as exc:
        message, details = describe_error(exc)
    assert message.startswith("internal error: KeyError") and "Traceback" in details


def test_app_imports_no_qt():
    """The use-case layer runs where Qt is not installed: importing app's job protocol and the
    use cases pulls in no PySide6 (checked in a fresh interpreter)."""
    import subprocess

    code = (
        "import sys; import tractlens.app.jobs, tractlens.app.usecases.commit, tractlens.app.usecases.fits, "
        "tractlens.app.fiber_arrays, tractlens.app.cli; "
        "print([m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'vtk', 'vtkmodules', 'pyvista')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def tractogram(n: int = 3) -> Tractogram:
    points = np.arange(n * 4 * 3, dtype=np.float32).reshape(-1, 3)
    return Tractogram(points, np.arange(0, 4 * n + 1, 4, dtype=np.int64), np.eye(4), (10, 10, 10))


def test_display_arrays_are_kept_per_layer_by_their_owner_and_go_with_the_layer():
    cache = FiberArrayCache()
    layer = Layer("t", tractogram(), "tractogram")
    first = cache.prepare(layer)
    assert cache.prepare(layer) is first  # computed once
    assert FiberArrayCache().prepare(layer) is not first  # another owner, its own copy: no module global
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    points, colours, offsets, streams = cache.on_reference(layer, affine)
    np.testing.assert_allclose(points, layer.data.points / 2.0, rtol=0, atol=1e-6)
    assert colours.shape == (12, 3) and streams.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    again = cache.on_reference(layer, np.eye(4))[0]  # another grid: recomputed
    np.testing.assert_array_equal(again, layer.data.points)
    del layer, first, points, colours, offsets, streams, again
    gc.collect()
    assert len(cache._arrays) == len(cache._on_grid) == 0
