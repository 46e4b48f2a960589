"""CSD engine: the SH convention, peaks of synthetic crossings, agreement with DIPY, MSMT tissues."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.csd_synth import (
    add_rician_noise,
    best_match_angles,
    crossing,
    fibre_signal,
    gradient_table,
    unit,
    voxel_signal,
)
from tractlens.gpu import sh
from tractlens.gpu.csd import CSDParams, build_model, fit_csd, signal_fractions
from tractlens.gpu.csd_response import anisotropic_response, find_shells, isotropic_response


def _directions(n, seed=0):
    return unit(np.random.default_rng(seed).normal(size=(n, 3)))


def _responses(bvals, bvecs, lmax=8):
    shells = find_shells(bvals, 50)
    fibres = _directions(150, seed=1)
    wm = anisotropic_response(np.array([fibre_signal(bvals, bvecs, d) for d in fibres]), bvecs, fibres, shells, lmax)
    gm = isotropic_response(voxel_signal(bvals, bvecs, fibres[:1], gm=1.0)[None], shells, lmax, "gm")
    csf = isotropic_response(voxel_signal(bvals, bvecs, fibres[:1], csf=1.0)[None], shells, lmax, "csf")
    return {"wm": wm, "gm": gm, "csf": csf}


def test_sh_basis_is_mrtrix3s_which_is_dipys_tournier07():
    from dipy.core.geometry import cart2sphere
    from dipy.reconst.shm import real_sh_tournier

    d = _directions(300)
    _, theta, phi = cart2sphere(*d.T)
    for lmax in (2, 4, 6, 8):
        dipy_basis, m, l_values = real_sh_tournier(lmax, theta, phi, legacy=False)
        np.testing.assert_allclose(sh.sh_basis(np, d, lmax), dipy_basis, atol=1e-12)
        degrees, orders = sh.degrees_orders(lmax)
        np.testing.assert_array_equal(degrees, l_values)
        np.testing.assert_array_equal(orders, m)
    assert sh.lmax_of(45) == 8 and sh.n_coefficients(8) == 45
    with pytest.raises(ValueError):
        sh.lmax_of(44)


def test_dipy_descoteaux_coefficients_convert_to_the_same_function():
    from dipy.core.geometry import cart2sphere
    from dipy.reconst.shm import real_sh_descoteaux

    from tractlens.app.io.fod import descoteaux_to_mrtrix

    d = _directions(200, seed=3)
    _, theta, phi = cart2sphere(*d.T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        basis_d, *_ = real_sh_descoteaux(8, theta, phi, legacy=True)
    c = np.random.default_rng(4).normal(size=45)
    np.testing.assert_allclose(sh.sh_basis(np, d, 8) @ descoteaux_to_mrtrix(c, 8), basis_d @ c, atol=1e-10)


def test_sh_rotation_matrix_rotates_the_function():
    rotation = np.linalg.qr(np.random.default_rng(5).normal(size=(3, 3)))[0]
    c = np.random.default_rng(6).normal(size=45)
    d = _directions(100, seed=7)
    m = sh.rotation_matrix(rotation, 8)
    np.testing.assert_allclose(sh.sh_basis(np, d @ rotation.T, 8) @ (m @ c), sh.sh_basis(np, d, 8) @ c, atol=1e-9)


def test_response_of_a_single_fibre_reproduces_its_signal():
    bvals, bvecs = gradient_table((1000.0, 3000.0), 60, 2)
    r = _responses(bvals, bvecs)["wm"]
    shells = find_shells(bvals, 50)
    fibre = unit([0.3, -0.5, 0.8])
    truth = fibre_signal(bvals, bvecs, fibre)
    for s in shells.weighted:
        v = shells.volumes(s)
        predicted = sh.zonal_basis(np.abs(bvecs[v] @ fibre), 8) @ r.zonal[s]
        assert np.abs(predicted - truth[v]).max() < 0.01 * truth[v].max()


# Single-shell CSD of noise-free and SNR-30 crossings: the angle of each true fibre to its
# nearest peak must be within these limits (degrees).
CROSSINGS = [(90, 2, 2.0, 5.0), (60, 2, 2.0, 6.0), (45, 2, 4.0, 10.0), (0, 3, 3.0, 8.0)]


@pytest.mark.parametrize("angle, fibres, clean_limit, noisy_limit", CROSSINGS)
def test_single_shell_csd_finds_the_crossing_fibres(angle, fibres, clean_limit, noisy_limit):
    bvals, bvecs = gradient_table((2500.0,), 90, 3)
    model = build_model(bvals, bvecs, _responses(bvals, bvecs), CSDParams())
    truth = crossing(angle, fibres)
    clean = np.tile(voxel_signal(bvals, bvecs, truth), (20, 1))
    noisy = add_rician_noise(clean, 30, seed=angle + fibres)
    fit = fit_csd(np.vstack([clean[:1], noisy]), model, device="cpu")
    assert max(best_match_angles(fit.peaks[0], truth)) <= clean_limit
    assert np.count_nonzero(fit.peak_values[0]) == fibres
    errors = np.array([best_match_angles(p, truth) for p in fit.peaks[1:]])
    assert np.median(errors) <= noisy_limit / 2
    assert np.percentile(errors, 90) <= noisy_limit


def test_super_resolved_csd_with_fewer_directions_than_coefficients():
    bvals, bvecs = gradient_table((3000.0,), 30, 1)  # 30 directions < 45 coefficients of lmax 8
    model = build_model(bvals, bvecs, _responses(bvals, bvecs), CSDParams())
    truth = crossing(70)
    fit = fit_csd(voxel_signal(bvals, bvecs, truth)[None], model, device="cpu")
    assert max(best_match_angles(fit.peaks[0], truth)) <= 4.0


def test_csd_agrees_with_dipy_on_the_same_data():
    """DIPY's ConstrainedSphericalDeconvModel with the exact fibre response (the tensor the
    data were made from) against ours with the response estimated from single fibres:
    fODF correlation on 724 directions ≥ 0.95, the same number of peaks, within 5° of DIPY's
    (its sphere's resolution) and no farther from the truth than DIPY's + 1°."""
    from dipy.core.gradients import gradient_table as dipy_table
    from dipy.data import default_sphere
    from dipy.direction import peak_directions
    from dipy.reconst.csdeconv import ConstrainedSphericalDeconvModel

    from tests.csd_synth import AXIAL, RADIAL

    bvals, bvecs = gradient_table((2000.0,), 90, 3)
    gtab = dipy_table(bvals, bvecs=np.where(bvals[:, None] > 0, bvecs, 0))
    truth = [crossing(a) for a in (90, 60, 50)] + [crossing(0, 3)]
    data = add_rician_noise(np.array([voxel_signal(bvals, bvecs, t) for t in truth]), 40, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dipy_fit = ConstrainedSphericalDeconvModel(
            gtab, (np.array([AXIAL, RADIAL, RADIAL]), 100.0), sh_order_max=8
        ).fit(data)
        dipy_odf = dipy_fit.odf(default_sphere)
    ours = fit_csd(data, build_model(bvals, bvecs, _responses(bvals, bvecs), CSDParams()), device="cpu")
    our_odf = ours.sh @ sh.sh_basis(np, default_sphere.vertices, 8).T
    for i in range(len(truth)):
        assert np.corrcoef(dipy_odf[i], our_odf[i])[0, 1] >= 0.95
        dipy_peaks, _, _ = peak_directions(
            dipy_odf[i], default_sphere, relative_peak_threshold=0.5, min_separation_angle=25
        )
        assert len(dipy_peaks) == np.count_nonzero(ours.peak_values[i])
        # DIPY's peaks are vertices of its 724-direction sphere (~7° apart, not refined)
        assert max(best_match_angles(ours.peaks[i], dipy_peaks)) <= 5.0
        ours_error = max(best_match_angles(ours.peaks[i], truth[i]))
        assert ours_error <= max(best_match_angles(dipy_peaks, truth[i])) + 1.0


def test_msmt_recovers_tissue_fractions_and_fibres():
    """Voxels without grey matter, or without fibres, are recovered to 0.06 (SNR 100; Rician noise puts ~0.05 into the WM of pure GM). With
    both, the non-negativity of the truncated (lmax 8) fODF moves part of the GM signal into
    the WM fODF's isotropic part — the exact constrained optimum does too — so there the
    solver is compared with that optimum (SLSQP) to 1e-4 instead (it solves the program exactly)."""
    from scipy.optimize import minimize

    from tractlens.gpu.csd import constraint_matrix

    bvals, bvecs = gradient_table((1000.0, 2000.0, 3000.0), 60, 4)
    model = build_model(bvals, bvecs, _responses(bvals, bvecs), CSDParams(msmt=True))
    truth = crossing(75)
    cases = [(0.0, 0.0), (0.0, 0.4), (0.0, 0.2), (0.7, 0.3), (1.0, 0.0)]
    signal = np.array([voxel_signal(bvals, bvecs, truth, gm=g, csf=c) for g, c in cases])
    fit = fit_csd(add_rician_noise(signal, 100, seed=2), model, CSDParams(msmt=True), device="cpu")
    fractions = signal_fractions(model, fit.sh, fit.tissues)
    expected = np.array([[1 - g - c, g, c] for g, c in cases])
    assert np.abs(fractions - expected).max() < 0.06
    for i in range(3):  # WM-dominated voxels: both fibres within 5°
        assert max(best_match_angles(fit.peaks[i], truth)) <= 5.0

    mixed = np.array([voxel_signal(bvals, bvecs, truth, gm=g, csf=c) for g, c in [(0.3, 0.0), (0.25, 0.25)]])
    fit = fit_csd(mixed, model, CSDParams(msmt=True), device="cpu")
    A, G = model.design, constraint_matrix(model)
    H = A.T @ A
    for i, s in enumerate(mixed):
        q = A.T @ s
        exact = minimize(
            lambda x, q=q: 0.5 * x @ H @ x - q @ x,
            np.linalg.lstsq(A, s, rcond=None)[0],
            jac=lambda x, q=q: H @ x - q,
            constraints=[{"type": "ineq", "fun": lambda x: G @ x, "jac": lambda x: G}],
            method="SLSQP",
            options={"ftol": 1e-15, "maxiter": 2000},
        ).x
        reference = signal_fractions(model, exact[None, :45], exact[None, 45:])
        assert np.abs(signal_fractions(model, fit.sh[i : i + 1], fit.tissues[i : i + 1]) - reference).max() < 1e-4


def test_nan_voxels_are_left_out_and_flagged():
    bvals, bvecs = gradient_table((2000.0,), 60, 2)
    model = build_model(bvals, bvecs, _responses(bvals, bvecs), CSDParams())
    signal = np.tile(voxel_signal(bvals, bvecs, crossing(90)), (4, 1))
    signal[1, 5] = np.nan
    fit = fit_csd(signal, model, device="cpu")
    assert fit.flags.tolist() == [0, 1, 0, 0]
    assert not fit.sh[1].any() and fit.sh[0].any()
    assert fit.flag_counts() == {"non-finite signal": 1}


def test_bad_acquisitions_are_refused_with_reasons():
    bvals, bvecs = gradient_table((1000.0,), 60, 2)
    responses = _responses(bvals, bvecs)
    with pytest.raises(ValueError, match="two b-value shells"):
        build_model(bvals, bvecs, responses, CSDParams(msmt=True))
    few_bvals, few_bvecs = gradient_table((1000.0,), 12, 1)
    with pytest.raises(ValueError, match="too few"):
        build_model(few_bvals, few_bvecs, _responses(few_bvals, few_bvecs), CSDParams(lmax=8))


@pytest.mark.gpu
@pytest.mark.parametrize("msmt", [False, True])
def test_gpu_matches_the_numpy_reference(msmt):
    """Same solver in float64 on both: SH within 1e-6 of the fODF's norm, peaks within 0.1°."""
    shells = (1000.0, 2500.0) if msmt else (2500.0,)
    bvals, bvecs = gradient_table(shells, 64, 3)
    params = CSDParams(msmt=msmt)
    model = build_model(bvals, bvecs, _responses(bvals, bvecs), params)
    rng = np.random.default_rng(11)
    truth = [crossing(a) for a in rng.uniform(40, 90, 300)]
    signal = add_rician_noise(np.array([voxel_signal(bvals, bvecs, t, gm=0.1 if msmt else 0) for t in truth]), 30)
    cpu = fit_csd(signal, model, params, device="cpu")
    gpu = fit_csd(signal, model, params, device="gpu")
    assert gpu.provenance["backend"] == "gpu"
    scale = np.linalg.norm(cpu.sh, axis=1).max()
    assert np.abs(gpu.sh - cpu.sh).max() <= 1e-5 * scale
    found = cpu.peak_values > 0
    dots = np.abs((gpu.peaks * cpu.peaks).sum(axis=2))[found]
    assert np.degrees(np.arccos(np.clip(dots, -1, 1))).max() <= 0.1
