"""The model fits' compiled CPU loops (:mod:`.watson_loops`, numba): when they run, and their inputs.

A model whose ``compiled`` names a loop here (NODDI-Watson) has its grid search and
Levenberg–Marquardt run one voxel at a time in compiled code on the CPU backend when numba (the
``cpu`` extra) is installed; otherwise, and on the GPU, the batched array program of
:mod:`.optimize` runs. Both are the same algorithm (tests/test_models_host.py compares them).
Voxels go to the loops in chunks of :data:`CHUNK`, so that ``cancelled()`` is polled between
chunks as the array program polls it between iterations.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from ..backend import Cancelled
from ..host import compile_or_uncached, numba_module
from .declare import Acquisition, Model, all_parameters
from .optimize import LM_LAMBDA0, LM_LAMBDA_STOP, LM_RELATIVE_TOL
from .special import NODES, P_AT_NODES, WEIGHTS, stick_coefficients

#: Voxels per call of a compiled loop (between two polls of ``cancelled()``: ~30 ms on one core)
CHUNK = 64
#: The compiled signals: Model.compiled -> the loops' module
COMPILED = ("noddi-watson",)


def _loops():
    from . import watson_loops

    return watson_loops


class CompiledFit:
    """Grid search and LM of one model on one acquisition, as compiled loops."""

    def __init__(self, model: Model, acq: Acquisition):
        self.model = model
        bvals = np.ascontiguousarray(acq.bvals, dtype=np.float64)
        d_par, d_iso = float(model.extra["d_par"]), float(model.extra["d_iso"])
        self.constants = (
            bvals,
            np.ascontiguousarray(acq.bvecs, dtype=np.float64),
            np.ascontiguousarray(stick_coefficients(np, bvals * d_par)),
            np.exp(-bvals * d_iso),
            d_par,
            np.ascontiguousarray(NODES),
            np.ascontiguousarray(WEIGHTS),
            np.ascontiguousarray(P_AT_NODES),
        )
        loops = _loops()
        parameters = all_parameters(model)
        kinds = []
        for p in parameters:
            lo, hi = np.isfinite(p.lower), np.isfinite(p.upper)
            kinds.append(loops.LOGISTIC if lo and hi else loops.LOWER if lo else loops.UPPER if hi else loops.FREE)
        self.kinds = np.asarray(kinds, dtype=np.int64)
        self.lower = np.asarray([p.lower for p in parameters], dtype=np.float64)
        self.upper = np.asarray([p.upper for p in parameters], dtype=np.float64)
        orientation = {name for pair in model.orientations for name in pair}
        gridded = [i for i, p in enumerate(model.parameters) if p.name not in orientation]
        axes = [model.parameters[i].init_grid or (model.parameters[i].default_start(),) for i in gridded]
        self.gridded = np.asarray([1 + i for i in gridded], dtype=np.int64)
        self.combos = np.asarray(list(itertools.product(*axes)), dtype=np.float64).reshape(-1, len(gridded))
        self.grid_loop, self.lm_loop, self.rms_loop = compile_or_uncached(
            lambda: (_loops().grid_voxels, _loops().lm_voxels, _loops().rms_voxels),
            self._compile,
            "models.watson_loops",
        )

    def _compile(self, loops) -> None:
        p = len(self.kinds)
        y, start = np.ones((0, len(self.constants[0]))), np.zeros((0, p))
        loops[0](y, start, self.combos, self.gridded, *self.constants, np.zeros((0, p)))
        loops[1](y, start, self.kinds, self.lower, self.upper, 1, LM_LAMBDA0, LM_LAMBDA_STOP, LM_RELATIVE_TOL,
                 *self.constants, np.zeros((0, p)), np.zeros(0))  # fmt: skip
        loops[2](y, start, *self.constants, np.zeros(0))

    def grid_search(self, y: np.ndarray, start: np.ndarray, cancelled=None) -> tuple[np.ndarray, float]:
        """optimize.grid_search's best starting values (N, 1 + P) (``start`` holds the
        orientations), and the CPU seconds this thread spent in the compiled loop."""
        y, start = np.ascontiguousarray(y), np.ascontiguousarray(start)
        best = np.empty_like(start)
        inside = 0.0
        for a in range(0, len(y), CHUNK):
            _poll(cancelled)
            b = a + CHUNK
            t = time.thread_time()
            self.grid_loop(y[a:b], start[a:b], self.combos, self.gridded, *self.constants, best[a:b])
            inside += time.thread_time() - t
        return best, inside

    def levenberg_marquardt(self, y, values0, iterations: int, cancelled=None):
        """optimize.levenberg_marquardt's fitted values (N, 1 + P) and sums of squares (N,), and
        the CPU seconds this thread spent in the compiled loop."""
        y, values0 = np.ascontiguousarray(y), np.ascontiguousarray(values0)
        fitted, cost = np.empty_like(values0), np.empty(len(y))
        inside = 0.0
        for a in range(0, len(y), CHUNK):
            _poll(cancelled)
            b = a + CHUNK
            t = time.thread_time()
            self.lm_loop(y[a:b], values0[a:b], self.kinds, self.lower, self.upper, iterations, LM_LAMBDA0,
                         LM_LAMBDA_STOP, LM_RELATIVE_TOL, *self.constants, fitted[a:b], cost[a:b])  # fmt: skip
            inside += time.thread_time() - t
        return fitted, cost, inside

    def rms(self, y, values) -> tuple[np.ndarray, float]:
        """Root-mean-square residuals (N,) of ``y`` at ``values`` (N, 1 + P), and the CPU
        seconds this thread spent in the compiled loop."""
        out = np.empty(len(y))
        t = time.thread_time()
        self.rms_loop(np.ascontiguousarray(y), np.ascontiguousarray(values), *self.constants, out)
        return out, time.thread_time() - t


def _poll(cancelled) -> None:
    if cancelled is not None and cancelled():
        raise Cancelled()


def compiled_fit(model: Model, acq: Acquisition, on_cpu: bool) -> CompiledFit | None:
    """The compiled loops of ``model`` when they can run here (the CPU backend, numba, a model
    that names them), else None (the array program runs)."""
    if not on_cpu or model.compiled not in COMPILED or numba_module() is None:
        return None
    return CompiledFit(model, acq)
