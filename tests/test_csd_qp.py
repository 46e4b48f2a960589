"""The exact multi-tissue CSD solver (gpu.csd_qp): KKT conditions, agreement with SciPy's
SLSQP and NNLS, iteration limits flagged, the fit's multi-tissue results at the optimum, the
interior-point start (same optimum as the plain active set, few active-set changes after it)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize, nnls

from tests.csd_synth import add_rician_noise, best_match_angles, crossing, gradient_table, unit, voxel_signal
from tests.test_csd import _responses
from tractlens.gpu.csd import CSDParams, build_model, constraint_matrix, fit_csd, shared_program
from tractlens.gpu.csd_qp import SharedQP, interior_point_guess, kkt_residuals, solve_batch

KKT_LIMIT = 1e-8


@pytest.fixture(scope="module")
def msmt_problem():
    """A three-shell acquisition's program and noisy voxels: 1-3 fibres with GM and CSF."""
    bvals, bvecs = gradient_table((1000.0, 2000.0, 3000.0), 60, 4)
    model = build_model(bvals, bvecs, _responses(bvals, bvecs), CSDParams(msmt=True))
    rng = np.random.default_rng(21)
    signals = []
    for _ in range(60):
        fibres = unit(rng.normal(size=(rng.integers(1, 4), 3)))
        signals.append(voxel_signal(bvals, bvecs, fibres, gm=rng.uniform(0, 0.4), csf=rng.uniform(0, 0.3)))
    signals = add_rician_noise(np.array(signals), 30, seed=5)
    H = model.design.T @ model.design
    return model, H, constraint_matrix(model), signals @ model.design, signals


def _assert_kkt(x, lam, q, H, G):
    residuals = kkt_residuals(x, lam, q, H, G)
    for name, values in residuals.items():
        assert values.max() <= KKT_LIMIT, (name, values.max())


def test_phantom_voxels_meet_the_kkt_conditions(msmt_problem):
    model, H, G, q, _ = msmt_problem
    x, lam, iterations, converged = solve_batch(np, q, shared_program(model), 2000)
    assert converged.all() and iterations < 2000
    _assert_kkt(x, lam, q, H, G)
    assert (lam > 0).any(axis=1).all()  # every voxel's unconstrained fit had a negative lobe


def test_random_programs_with_dependent_constraints_meet_the_kkt_conditions():
    """Random well- and ill-conditioned H; more constraints than unknowns, some repeated,
    around a common direction (a cone with an interior, as the fODF's non-negativity)."""
    rng = np.random.default_rng(3)
    for condition in (1e1, 1e6):
        basis = np.linalg.qr(rng.normal(size=(12, 12)))[0]
        H = basis @ np.diag(np.geomspace(1, condition, 12)) @ basis.T
        G = unit(rng.normal(size=(40, 12)) + 2.5 * unit(np.ones(12)))
        G = np.vstack([G, G[:5]])  # duplicated rows: linearly dependent constraints
        q = rng.normal(size=(200, 12)) * 10
        x, lam, _, converged = solve_batch(np, q, SharedQP.from_matrices(H, G), 500)
        assert converged.all()
        _assert_kkt(x, lam, q, H, G)


def test_the_optimum_is_slsqps_and_scipys_dual_nnls(msmt_problem):
    """SLSQP (scaled, ftol 1e-14) is feasible and its objective equals ours to 1e-9; its
    solution is only determined to ~1e-6 in the H norm (κ(H) ≈ 1e6), so x is compared there
    to 1e-5 — and to 1e-8 with SciPy's Lawson–Hanson NNLS on the dual, an exact method."""
    model, H, G, q, _ = msmt_problem
    x, *_ = solve_batch(np, q[:6], shared_program(model), 2000)
    factor = np.linalg.cholesky(H)
    dual_matrix = np.linalg.solve(factor, G.T)
    scale = H.shape[0] / np.trace(H)
    for i in range(6):
        size = np.linalg.norm(np.linalg.solve(H, q[i]))
        Hs, qs = H * scale, q[i] * scale / size
        reference = minimize(
            lambda v, Hs=Hs, qs=qs: 0.5 * v @ Hs @ v - qs @ v,
            np.zeros(len(qs)),
            jac=lambda v, Hs=Hs, qs=qs: Hs @ v - qs,
            constraints=[{"type": "ineq", "fun": lambda v: G @ v, "jac": lambda v: G}],
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 5000},
        )
        assert reference.success
        x_ref = reference.x * size

        def objective(v, i=i):
            return 0.5 * v @ H @ v - q[i] @ v

        assert abs(objective(x[i]) - objective(x_ref)) <= 1e-9 * abs(objective(x_ref))
        difference = x[i] - x_ref
        assert np.sqrt(difference @ H @ difference) <= 1e-5 * np.sqrt(x[i] @ H @ x[i])
        lam, _ = nnls(dual_matrix, -np.linalg.solve(factor, q[i]), maxiter=5000)
        x_nnls = np.linalg.solve(H, q[i] + G.T @ lam)
        assert np.abs(x[i] - x_nnls).max() <= 1e-8 * np.linalg.norm(x[i])


def test_feasible_and_zero_voxels_need_no_constraint():
    rng = np.random.default_rng(8)
    H = np.diag(rng.uniform(1, 2, 6))
    G = np.eye(6)
    q = np.vstack([np.zeros(6), rng.uniform(0.1, 1, 6)])  # x = H⁻¹q is already ≥ 0
    x, lam, iterations, converged = solve_batch(np, q, SharedQP.from_matrices(H, G), 10)
    assert converged.all() and iterations == 1 and not lam.any()
    np.testing.assert_allclose(x, q / np.diag(H), rtol=1e-12)


def test_the_iteration_limit_is_reported_per_voxel(msmt_problem):
    model, _, _, q, _ = msmt_problem
    _, _, iterations, converged = solve_batch(np, q, shared_program(model), 5)
    assert iterations == 5 and not converged.any()


def test_fit_flags_voxels_at_the_limit_and_converges_by_default(msmt_problem):
    model, *_, signals = msmt_problem
    signal = signals[:8]
    tight = fit_csd(signal, model, CSDParams(msmt=True, msmt_max_iterations=2), device="cpu", batch_voxels=3)
    at_limit = tight.flag_counts().get("not converged", 0)
    assert at_limit > 0
    assert len(tight.provenance["not_converged_per_batch"]) == 3  # 8 voxels in batches of 3
    assert sum(tight.provenance["not_converged_per_batch"]) == at_limit
    full = fit_csd(signal, model, CSDParams(msmt=True), device="cpu")
    assert "not converged" not in full.flag_counts()
    # one batch per CPU thread at most (voxel batches run side by side on the CPU's threads)
    assert full.provenance["not_converged_per_batch"] == [0] * full.provenance["batches"]
    assert full.provenance["solver"].startswith("exact active set")


def test_multi_tissue_fit_is_the_exact_optimum(msmt_problem):
    """fit_csd's SH and tissues (float32) are the program's optimum; fODF ≥ 0 on the constraints."""
    model, _, G, _, _ = msmt_problem
    bvals, bvecs = gradient_table((1000.0, 2000.0, 3000.0), 60, 4)
    truth = crossing(70)
    signal = add_rician_noise(np.array([voxel_signal(bvals, bvecs, truth, gm=0.2, csf=0.1)] * 4), 40, seed=4)
    fit = fit_csd(signal, model, CSDParams(msmt=True), device="cpu")
    x, *_ = solve_batch(np, signal @ model.design, shared_program(model), 2000)
    got = np.hstack([fit.sh, fit.tissues]).astype(np.float64)
    assert np.abs(got - x).max() <= 1e-6 * np.abs(x).max()
    amplitudes = got @ G.T
    assert amplitudes.min() >= -1e-6 * np.linalg.norm(got, axis=1).max()


def _stage_counts(work):
    """Per stage: (batched steps, voxel-solves) from solve_batch's ``work`` entries."""
    counts = {}
    for stage, voxels, _ in work:
        steps, solves = counts.get(stage, (0, 0))
        counts[stage] = (steps + 1, solves + voxels)
    return counts


def test_interior_point_start_reaches_the_plain_active_sets_optimum(msmt_problem):
    """The default (interior point, then Lawson-Hanson) and Lawson-Hanson from an empty set
    reach the same optimum (unique: H is positive definite) and the same active constraints."""
    model, H, G, q, _ = msmt_problem
    shared = shared_program(model)
    x_plain, lam_plain, _, converged_plain = solve_batch(np, q, shared, 2000, interior_iterations=0)
    x, lam, _, converged = solve_batch(np, q, shared, 2000)
    assert converged.all() and converged_plain.all()
    _assert_kkt(x, lam, q, H, G)
    assert np.abs(x - x_plain).max() <= 1e-8 * np.abs(x_plain).max()
    np.testing.assert_array_equal(lam > 0, lam_plain > 0)


def test_interior_point_start_leaves_few_active_set_changes(msmt_problem):
    """From the interior point's multipliers the active set needs about one solve a voxel (the
    empty start needs one per constraint that enters or leaves, ~40 here); the interior point
    stops each voxel at its own complementarity, before its iteration limit."""
    model, _, _, q, _ = msmt_problem
    shared = shared_program(model)
    n = len(q)
    plain, started = [], []
    solve_batch(np, q, shared, 2000, interior_iterations=0, work=plain)
    _, _, iterations, _ = solve_batch(np, q, shared, 2000, work=started)
    plain, started = _stage_counts(plain), _stage_counts(started)
    assert plain["active set"][1] / n >= 20
    interior_steps, interior_solves = started["interior"]
    assert interior_solves / n < interior_steps <= 20  # voxels leave at their own convergence
    assert started["active set"][1] / n <= 2.0
    assert started["active set"][0] <= 8
    assert iterations == 1 + interior_steps + started["active set"][0]


def test_interior_point_guess_is_the_active_set_on_most_voxels(msmt_problem):
    model, _, _, q, _ = msmt_problem
    shared = shared_program(model)
    _, lam, _, _ = solve_batch(np, q, shared, 2000)
    guess, iterations = interior_point_guess(np, q @ shared.hessian_inverse, shared, 20)
    assert iterations <= 20 and (guess >= 0).all()
    agree = ((guess > 0) == (lam > 0)).all(axis=1)
    assert agree.mean() >= 0.7  # 82 % here; the others differ by one or two near-degenerate constraints
    # where the sets agree, the interior point's multipliers are close to the exact ones
    error = np.abs(guess - lam)[agree].max(axis=1) / np.abs(lam[agree]).max(axis=1)
    assert np.median(error) <= 1e-3


@pytest.mark.parametrize("interior_iterations", [1, 3, 6])
def test_a_poor_interior_point_start_still_ends_at_the_optimum(msmt_problem, interior_iterations):
    """Stopped early, the interior point's guess is wrong on most voxels; the active-set stage
    (Lawson-Hanson from a dual-feasible start) still ends exactly."""
    model, H, G, q, _ = msmt_problem
    shared = shared_program(model)
    x_plain, *_ = solve_batch(np, q, shared, 2000, interior_iterations=0)
    x, lam, _, converged = solve_batch(np, q, shared, 2000, interior_iterations=interior_iterations)
    assert converged.all()
    _assert_kkt(x, lam, q, H, G)
    assert np.abs(x - x_plain).max() <= 1e-8 * np.abs(x_plain).max()


def test_any_non_negative_start_ends_at_the_optimum(msmt_problem):
    """Random multipliers on random constraint sets (many more than the 47 unknowns allow
    to be active) are a dual-feasible start; Lawson-Hanson still ends at the optimum."""
    model, H, G, q, _ = msmt_problem
    shared = shared_program(model)
    rng = np.random.default_rng(4)
    start = rng.uniform(0, 1, (len(q), G.shape[0])) * (rng.uniform(size=(len(q), G.shape[0])) < 0.3)
    start *= np.linalg.norm(q, axis=1, keepdims=True) / 1e3
    x_plain, *_ = solve_batch(np, q, shared, 2000, interior_iterations=0)
    x, lam, _, converged = solve_batch(np, q, shared, 5000, start=start)
    assert converged.all()
    _assert_kkt(x, lam, q, H, G)
    assert np.abs(x - x_plain).max() <= 1e-8 * np.abs(x_plain).max()


def test_a_failed_factorisation_ends_the_interior_point_not_the_fit(msmt_problem, monkeypatch):
    """NumPy raises when rounding makes a normal matrix indefinite; the interior point then
    stops where it is and the active-set stage still ends at the optimum."""
    model, H, G, q, _ = msmt_problem
    shared = shared_program(model)
    x_plain, *_ = solve_batch(np, q, shared, 2000, interior_iterations=0)
    cholesky, calls = np.linalg.cholesky, []

    def failing_on_the_fourth(a):
        calls.append(1)
        if len(calls) == 4:
            raise np.linalg.LinAlgError("Matrix is not positive definite")
        return cholesky(a)

    monkeypatch.setattr(np.linalg, "cholesky", failing_on_the_fourth)
    work = []
    x, lam, _, converged = solve_batch(np, q, shared, 2000, work=work)
    assert len(calls) == 4 and sum(stage == "interior" for stage, *_ in work) == 4
    assert converged.all()
    _assert_kkt(x, lam, q, H, G)
    assert np.abs(x - x_plain).max() <= 1e-8 * np.abs(x_plain).max()


@pytest.mark.gpu
def test_gpu_solver_matches_numpy(msmt_problem):
    """The same solver on CuPy: KKT to the same limit, x within 1e-7 of NumPy's (the optimum is
    unique; rounding may order the slots and break near-ties differently)."""
    import cupy as cp

    model, H, G, q, _ = msmt_problem
    shared = shared_program(model)
    x_cpu, *_ = solve_batch(np, q, shared, 2000)
    x_gpu, lam_gpu, _, converged = solve_batch(cp, cp.asarray(q), shared, 2000)
    assert bool(converged.all())
    x_gpu, lam_gpu = cp.asnumpy(x_gpu), cp.asnumpy(lam_gpu)
    _assert_kkt(x_gpu, lam_gpu, q, H, G)
    assert np.abs(x_gpu - x_cpu).max() <= 1e-7 * np.abs(x_cpu).max()


def test_msmt_finds_the_cli_phantoms_crossing_with_reference_responses():
    """The CLI test's acquisition (45 directions at b = 1000, 2500): a 58.7° crossing is found
    with each fibre within 5° when the responses are the phantom's own."""
    bvals, bvecs = gradient_table((1000.0, 2500.0), 45, 3)
    params = CSDParams(msmt=True)
    model = build_model(bvals, bvecs, _responses(bvals, bvecs), params)
    truth = crossing(60)
    signal = add_rician_noise(np.array([voxel_signal(bvals, bvecs, truth)] * 5), 500, seed=7)
    fit = fit_csd(signal, model, params, device="cpu")
    assert "not converged" not in fit.flag_counts()
    for peaks in fit.peaks:
        assert max(best_match_angles(peaks, truth)) <= 5.0
