"""bedpostX model 2 (gamma-distributed diffusivities, FSL's default), angles in FSL's ranges,
and the files and options that come with them."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.gpu.ballstick import (
    MODEL2_D_MAX,
    MODEL2_D_STD_MAX,
    BallStickParams,
    angles_to_vectors,
    ball_stick_signal,
    compartment_signal,
    vectors_to_angles,
    wrap_angles,
)
from tractlens.gpu.ballstick_fit import fit_ballstick
from tractlens.gpu.ballstick_mcmc import mcmc_numpy

MULTI_SHELL = ((1000, 30), (2000, 30), (3000, 30))
SHORT = dict(burnin=300, njumps=500, sample_every=10)


def gradient_table(rng, shells=MULTI_SHELL, n_b0=6):
    bvals, bvecs = [np.zeros(n_b0)], [np.zeros((n_b0, 3))]
    for b, k in shells:
        v = rng.normal(size=(k, 3))
        bvals.append(np.full(k, float(b)))
        bvecs.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    return np.concatenate(bvals), np.concatenate(bvecs)


def gamma_voxels(rng, n, d, d_std, f=0.5, s0=1000.0, snr=40.0, shells=MULTI_SHELL):
    """Noisy one-stick voxels of the model-2 forward model; returns signal, bvals, bvecs, true axes."""
    bvals, bvecs = gradient_table(rng, shells)
    axes = rng.normal(size=(n, 1, 3))
    axes /= np.linalg.norm(axes, axis=-1, keepdims=True)
    th, ph = vectors_to_angles(np, axes)
    clean = ball_stick_signal(
        bvals, bvecs, np.full(n, s0), np.full(n, d), th, ph, np.full((n, 1), f), d_std=np.asarray(d_std) + np.zeros(n)
    )
    return clean + rng.normal(0, s0 / snr, clean.shape), bvals, bvecs, axes[:, 0]


def test_model2_compartment_is_the_gamma_average_of_exponentials():
    """(1 + b σ²/d)^(−d²/σ²) is E[exp(−b D)] for D gamma-distributed with mean d and std σ
    (checked by quadrature), and tends to model 1's exp(−b d) as σ → 0, in float32 too."""
    from scipy import integrate, stats

    d, sd = 1.0e-3, 0.6e-3
    shape, scale = (d / sd) ** 2, sd * sd / d
    for b in (0.0, 1000.0, 3000.0, 10000.0):
        expected, _ = integrate.quad(lambda x, b=b: np.exp(-b * x) * stats.gamma.pdf(x, shape, scale=scale), 0, 0.05)
        assert compartment_signal(b, d, sd) == pytest.approx(expected, rel=1e-7)
    b = np.array([0.0, 1000.0, 3000.0], np.float32)
    tiny = compartment_signal(b, np.float32(d), np.float32(1e-8))
    np.testing.assert_allclose(tiny, np.exp(-b * d), rtol=1e-6)


def test_model2_recovers_the_diffusivity_spread():
    """Multi-shell voxels with a narrow and a wide spread of diffusivities: model 2 finds the wide
    spread and the true mean diffusivity; model 1 (one diffusivity) underestimates d there."""
    rng = np.random.default_rng(3)
    n = 24
    spread = np.where(np.arange(n) < n // 2, 0.1e-3, 0.8e-3)
    signal, bvals, bvecs, axes = gamma_voxels(rng, n, 1.0e-3, spread)
    fit2 = fit_ballstick(signal, bvals, bvecs, BallStickParams(n_fibres=1, model=2, **SHORT), device="cpu")
    fit1 = fit_ballstick(signal, bvals, bvecs, BallStickParams(n_fibres=1, model=1, **SHORT), device="cpu")
    wide, narrow = slice(n // 2, n), slice(0, n // 2)
    d_std = fit2.d_std.mean(axis=1)
    assert fit2.d_std.shape == fit2.d.shape and fit1.d_std is None
    assert np.median(d_std[wide]) == pytest.approx(0.8e-3, rel=0.2)
    assert np.median(d_std[narrow]) < 0.35e-3
    assert np.median(fit2.d.mean(axis=1)[wide]) == pytest.approx(1.0e-3, rel=0.12)
    assert np.median(fit1.d.mean(axis=1)[wide]) < 0.8e-3  # what the spread does to model 1
    # every sample within FSL's bounds; the stick found either way
    assert (fit2.d > 0).all() and (fit2.d <= MODEL2_D_MAX * 1.0001).all()
    assert (fit2.d_std > 0).all() and (fit2.d_std <= MODEL2_D_STD_MAX * 1.0001).all()
    dyads, _ = fit2.dyads()
    cos = np.abs((dyads[:, 0] * axes).sum(-1))
    assert np.median(np.rad2deg(np.arccos(np.clip(cos, 0, 1)))) < 6.0


def test_model2_chain_is_reproducible_and_independent_of_batching():
    rng = np.random.default_rng(4)
    signal, bvals, bvecs, _ = gamma_voxels(rng, 10, 1.0e-3, 0.5e-3)
    params = BallStickParams(n_fibres=2, model=2, burnin=20, njumps=30, sample_every=3, seed=7)
    one = fit_ballstick(signal, bvals, bvecs, params, device="cpu")
    again = fit_ballstick(signal, bvals, bvecs, params, device="cpu")
    np.testing.assert_array_equal(one.d_std, again.d_std)
    np.testing.assert_array_equal(one.theta, again.theta)
    # Batches share the random streams; the NumPy LM's start differs by rounding only (1e-7 with
    # batch size, as for model 1), which the chain carries on at float32 precision.
    batched = fit_ballstick(signal, bvals, bvecs, params, device="cpu", batch_voxels=3)
    np.testing.assert_allclose(batched.d_std, one.d_std, rtol=1e-4)
    np.testing.assert_allclose(batched.theta, one.theta, rtol=1e-4, atol=1e-5)
    assert one.acceptance.shape == (10, params.n_params) == (10, 2 + 3 * 2 + 1)


def test_model_option_is_validated():
    with pytest.raises(ValueError, match="model must be 1 or 2"):
        BallStickParams(model=3)
    assert BallStickParams().model == 1  # earlier versions' results; FSL's 2 is asked for with --model 2
    assert BallStickParams(rician=True, model=2).n_params == 2 + 9 + 1 + 1


def test_angles_are_wrapped_into_fsl_ranges_with_the_same_directions():
    rng = np.random.default_rng(5)
    theta = rng.uniform(-3 * np.pi, 3 * np.pi, 4000).astype(np.float32)
    phi = rng.uniform(-5 * np.pi, 5 * np.pi, 4000).astype(np.float32)
    th, ph = wrap_angles(theta, phi)
    assert th.dtype == np.float32 and ph.dtype == np.float32
    assert ((th >= 0) & (th <= np.float32(np.pi))).all()
    assert ((ph > -np.float32(np.pi)) & (ph <= np.float32(np.pi))).all()
    before = angles_to_vectors(np, theta.astype(np.float64), phi.astype(np.float64))
    after = angles_to_vectors(np, th.astype(np.float64), ph.astype(np.float64))
    np.testing.assert_allclose(after, before, atol=5e-6)
    inside = (theta >= 0) & (theta <= np.pi) & (phi > -np.pi) & (phi <= np.pi)
    assert inside.any()
    np.testing.assert_array_equal(th[inside], theta[inside])  # in range: bit for bit
    np.testing.assert_array_equal(ph[inside], phi[inside])
    # a block of angles at a time (bounded temporaries) gives the same values, any shape
    shaped = theta.reshape(40, 2, 50), phi.reshape(40, 2, 50)
    th_blocks, ph_blocks = wrap_angles(*shaped, block=333)
    assert th_blocks.shape == (40, 2, 50) and th_blocks.dtype == np.float32
    np.testing.assert_array_equal(th_blocks.reshape(-1), th)
    np.testing.assert_array_equal(ph_blocks.reshape(-1), ph)


def test_fitted_angles_are_in_fsl_ranges_and_the_dyads_are_unchanged():
    """The chain's angles roam past ±π; the fit hands them over wrapped, and the mean dyads
    (what probtrackx and the display use) are those of the unwrapped samples."""
    from tractlens.gpu import ballstick_fit

    rng = np.random.default_rng(6)
    signal, bvals, bvecs, _ = gamma_voxels(rng, 30, 1.0e-3, 0.3e-3, f=0.3)
    params = BallStickParams(n_fibres=2, model=1, burnin=50, njumps=200, sample_every=5, seed=2)
    raw = {}
    original = ballstick_fit.wrap_angles

    def keep(theta, phi, xp=np):
        raw["theta"], raw["phi"] = theta.copy(), phi.copy()
        return original(theta, phi, xp)

    ballstick_fit.wrap_angles = keep
    try:
        fit = fit_ballstick(signal, bvals, bvecs, params, device="cpu")
    finally:
        ballstick_fit.wrap_angles = original
    outside = (raw["theta"] < 0) | (raw["theta"] > np.pi) | (raw["phi"] <= -np.pi) | (raw["phi"] > np.pi)
    assert outside.any()  # the case this is about occurs
    assert ((fit.theta >= 0) & (fit.theta <= np.float32(np.pi))).all()
    assert ((fit.phi > -np.float32(np.pi)) & (fit.phi <= np.float32(np.pi))).all()
    from tractlens.gpu.ballstick import dyadic_mean

    dyads, dispersion = fit.dyads()
    dyads_raw, dispersion_raw = dyadic_mean(raw["theta"], raw["phi"])
    np.testing.assert_allclose(np.abs((dyads * dyads_raw).sum(-1)), 1.0, atol=1e-6)
    np.testing.assert_allclose(dispersion, dispersion_raw, atol=1e-6)


@pytest.mark.gpu
def test_model2_mcmc_kernel_tracks_the_reference_step_by_step():
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.ballstick_mcmc import mcmc_kernel

    backend = get_backend("gpu")
    rng = np.random.default_rng(9)
    n = 256
    signal, bvals, bvecs, axes = gamma_voxels(rng, n, 1.0e-3, 0.5e-3)
    y = signal / 1000.0
    b_scale = bvals.max()
    b = bvals / b_scale
    params = BallStickParams(n_fibres=2, model=2, burnin=0, njumps=3, sample_every=1, seed=5)
    th, ph = vectors_to_angles(np, axes)
    start = [np.ones(n), np.full(n, 1.0e-3 * b_scale), th, ph, np.full(n, 0.5)]
    start += [th + 0.5, ph, np.full(n, 0.02), np.full(n, 0.4e-3 * b_scale)]
    start = np.stack(start, 1)
    bounds = {"d_max": MODEL2_D_MAX * b_scale, "d_std_max": MODEL2_D_STD_MAX * b_scale}
    ref, ref_rate = mcmc_numpy(y, b, bvecs, start, np.arange(n, dtype=np.uint64), params, **bounds)
    y_gpu = backend.asarray(y.astype(np.float32))
    gpu, rate = mcmc_kernel(backend, y_gpu, b, bvecs, backend.asarray(start), 0, params, **bounds)
    gpu = backend.to_host(gpu)
    same = np.isclose(gpu, ref, rtol=1e-3, atol=1e-5).all(axis=(1, 2))
    assert same.mean() >= 0.97, same.mean()
    assert np.array_equal(backend.to_host(rate)[same], ref_rate[same])


@pytest.mark.gpu
def test_model2_recovers_the_diffusivity_spread_on_the_gpu():
    rng = np.random.default_rng(3)
    n = 2000
    spread = np.where(np.arange(n) < n // 2, 0.1e-3, 0.8e-3)
    signal, bvals, bvecs, _ = gamma_voxels(rng, n, 1.0e-3, spread)
    fit = fit_ballstick(signal, bvals, bvecs, BallStickParams(n_fibres=1, model=2), device="gpu")
    d_std = fit.d_std.mean(axis=1)
    assert np.median(d_std[n // 2 :]) == pytest.approx(0.8e-3, rel=0.2)
    assert np.median(d_std[: n // 2]) < 0.35e-3
    assert np.median(fit.d.mean(axis=1)[n // 2 :]) == pytest.approx(1.0e-3, rel=0.12)
    assert ((fit.theta >= 0) & (fit.theta <= np.float32(np.pi))).all()


# ---------------------------------------------------------------- files and command line


@pytest.fixture(scope="module")
def gamma_dwi(tmp_path_factory):
    """A 4x3x2 multi-shell DWI of the model-2 forward model, FSL bvecs."""
    from tractlens.app.io import save_gradients, save_volume

    rng = np.random.default_rng(12)
    shape = (4, 3, 2)
    signal, bvals, bvecs, _ = gamma_voxels(rng, int(np.prod(shape)), 1.0e-3, 0.6e-3)
    folder = tmp_path_factory.mktemp("gamma_dwi")
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    save_volume(signal.reshape(*shape, -1).astype(np.float32), affine, folder / "dwi.nii.gz")
    save_gradients(bvals, bvecs, affine, folder / "dwi.bval", folder / "dwi.bvec")
    save_volume(np.ones(shape, np.uint8), affine, folder / "mask.nii.gz")
    return folder


def test_fit_ballstick_model2_command_writes_mean_d_stdsamples(gamma_dwi, tmp_path):
    import json

    import nibabel as nib

    from tests.test_cli import run_cli

    args = ["fit-ballstick", str(gamma_dwi / "dwi.nii.gz"), "--mask", str(gamma_dwi / "mask.nii.gz")]
    args += ["--nfibres", "1", "--burnin", "200", "--njumps", "200", "--sampleevery", "10", "--device", "cpu"]
    result = run_cli(*args, "--model", "2", "-o", str(tmp_path / "m2"), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["params"]["model"] == 2 and "mean_d_stdsamples.nii.gz" in summary["files"]
    d_std = nib.load(tmp_path / "m2" / "mean_d_stdsamples.nii.gz").get_fdata()
    assert d_std.shape == (4, 3, 2) and np.median(d_std) == pytest.approx(0.6e-3, rel=0.35)
    assert summary["d_std_mean"] == pytest.approx(float(d_std.mean()), rel=1e-5)
    theta = nib.load(tmp_path / "m2" / "merged_th1samples.nii.gz").get_fdata()
    assert ((theta >= 0) & (theta <= np.pi + 1e-6)).all()

    one = run_cli(*args, "--model", "1", "-o", str(tmp_path / "m1"), "--json")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["params"]["model"] == 1
    assert not (tmp_path / "m1" / "mean_d_stdsamples.nii.gz").exists()
    bad = run_cli(*args, "--model", "3", "-o", str(tmp_path / "m3"))
    assert bad.returncode != 0 and "model" in bad.stderr


def test_multi_shell_data_fitted_with_model_1_get_a_note():
    from tractlens.app.io.dwi import DWI
    from tractlens.app.pipelines.ballstick import fit_ballstick_pipeline

    rng = np.random.default_rng(0)
    for shells, noted in (((1000.0, 2000.0), True), ((1000.0,), False)):
        bvals = np.concatenate([[0.0, 0.0], np.repeat(shells, 12)])
        bvecs = rng.normal(size=(len(bvals), 3))
        bvecs /= np.linalg.norm(bvecs, axis=1, keepdims=True)
        bvecs[bvals == 0] = 0
        data = np.exp(-bvals * 1e-3)[None, None, None, :] * 100 * (1 + 0.01 * rng.random((2, 2, 1, len(bvals))))
        dwi = DWI(data.astype(np.float32), np.eye(4), bvals, bvecs)
        params = BallStickParams(n_fibres=1, burnin=2, njumps=4, sample_every=2)
        result = fit_ballstick_pipeline(dwi, mask=np.ones((2, 2, 1), bool), params=params, device="cpu")
        assert any("model 2, FSL's default" in w for w in result.warnings) == noted
