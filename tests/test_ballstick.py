"""Ball & sticks (bedpostX): accuracy on synthetic voxels, the CUDA kernels against the NumPy
reference, reproducibility, bad voxels, and the bedpostX folder round trip."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from tractlens.gpu import ballstick
from tractlens.gpu.ballstick import FLAG_NOT_FITTED, angles_to_vectors, ball_stick_signal, vectors_to_angles
from tractlens.gpu.ballstick_fit import fit_ballstick
from tractlens.gpu.ballstick_lm import lm_numpy
from tractlens.gpu.ballstick_mcmc import mcmc_numpy
from tractlens.gpu.rng import philox4x32

# These assertions were made for model 1 (one diffusivity), which they keep; model 2, the
# default, has its own tests (test_ballstick_model2.py).
BallStickParams = partial(ballstick.BallStickParams, model=1)

# Short chains keep the NumPy runs in CI to seconds; the GPU runs FSL's defaults.
SHORT = dict(burnin=300, njumps=500, sample_every=10)


def chain(device: str) -> dict:
    return {} if device == "gpu" else SHORT


def gradient_table(rng, shells=((1000, 32), (2000, 32)), n_b0=4):
    """n_b0 b=0 rows and random unit directions per shell (like the demo's acquisition)."""
    bvals, bvecs = [np.zeros(n_b0)], [np.zeros((n_b0, 3))]
    for b, k in shells:
        v = rng.normal(size=(k, 3))
        bvals.append(np.full(k, float(b)))
        bvecs.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    return np.concatenate(bvals), np.concatenate(bvecs)


def unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def crossing(rng, n, angle_deg):
    """n pairs of unit vectors at ``angle_deg`` in random planes."""
    v1 = unit(rng.normal(size=(n, 3)))
    perp = unit(np.cross(v1, rng.normal(size=(n, 3))))
    a = np.deg2rad(angle_deg)
    return np.stack([v1, np.cos(a) * v1 + np.sin(a) * perp], axis=1)


def simulate(rng, bvals, bvecs, dirs, fractions, s0=1000.0, d=1.5e-3, snr=30.0):
    """Rician-noisy ball & sticks signals (N, M) of sticks ``dirs`` (N, L, 3) with ``fractions`` (N, L)."""
    n = len(dirs)
    th, ph = vectors_to_angles(np, dirs)
    clean = ball_stick_signal(bvals, bvecs, np.full(n, s0), np.full(n, d), th, ph, fractions)
    sigma = s0 / snr
    return np.hypot(clean + rng.normal(0, sigma, clean.shape), rng.normal(0, sigma, clean.shape))


def axial_error(a, b):
    """Angle in degrees between axes a and b (..., 3)."""
    cos = np.abs((unit(a) * unit(b)).sum(-1))
    return np.rad2deg(np.arccos(np.clip(cos, 0, 1)))


def crossing_errors(dyads, truth):
    """Per-stick errors (2N,) of the first two dyads against the two true axes, best pairing."""
    straight = np.stack([axial_error(dyads[:, 0], truth[:, 0]), axial_error(dyads[:, 1], truth[:, 1])], 1)
    swapped = np.stack([axial_error(dyads[:, 0], truth[:, 1]), axial_error(dyads[:, 1], truth[:, 0])], 1)
    pick = straight.max(1) <= swapped.max(1)
    return np.where(pick[:, None], straight, swapped).ravel()


def test_philox_matches_the_random123_known_answers():
    """Philox4x32-10 known-answer vectors of Random123 (kat_vectors)."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for counter, key, expected in cases:
        assert tuple(int(x) for x in philox4x32(counter, key)) == expected


def test_lm_recovers_noise_free_single_and_crossing_fibres(rng):
    bvals, bvecs = gradient_table(rng)
    b = bvals / bvals.max()
    n = 40
    dirs = crossing(rng, n, 80)
    th, ph = vectors_to_angles(np, dirs)
    f = np.tile([0.4, 0.3], (n, 1))
    y = ball_stick_signal(bvals, bvecs, np.ones(n), np.full(n, 1.5e-3), th, ph, f)
    # Start a little off the truth: LM must walk back to it.
    q = np.sqrt(f * (1 + f.sum(1, keepdims=True) / (1 - f.sum(1, keepdims=True))))
    x0 = np.stack([np.full(n, 0.9), np.full(n, np.log(1.5e-3 * bvals.max() * 1.3))], 1)
    sticks = np.stack([th + 0.15, ph - 0.1, q * 0.7], 2).reshape(n, -1)
    x, cost = lm_numpy(y, b, bvecs, np.concatenate([x0, sticks], 1), 2, 200)
    assert np.median(cost) < 1e-12
    fitted = angles_to_vectors(np, x[:, 2::3], x[:, 3::3])
    assert np.median(axial_error(fitted, dirs)) < 1e-3
    assert np.allclose(np.exp(x[:, 1]) / bvals.max(), 1.5e-3, rtol=1e-4)


def test_single_fibres_are_accurate_and_ard_empties_the_extra_sticks(device):
    rng = np.random.default_rng(7)
    bvals, bvecs = gradient_table(rng)
    n = 64
    dirs = unit(rng.normal(size=(n, 1, 3)))
    signal = simulate(rng, bvals, bvecs, dirs, np.full((n, 1), 0.6))
    fit = fit_ballstick(signal, bvals, bvecs, BallStickParams(n_fibres=3, **chain(device)), device=device)
    dyads, dispersion = fit.dyads()
    error = axial_error(dyads[:, 0], dirs[:, 0])
    fmean = fit.f.mean(axis=2)
    print(f"\n[{device}] single fibre: median error {np.median(error):.2f}°, mean f = {fmean.mean(0).round(3)}")
    assert np.median(error) <= 5.0
    assert abs(np.median(fmean[:, 0]) - 0.6) < 0.05
    assert np.median(fmean[:, 2]) < 0.02 and fmean[:, 2].mean() < 0.05  # ARD: the third stick ≈ 0
    assert np.median(fit.d.mean(1)) == pytest.approx(1.5e-3, rel=0.1)
    assert np.median(fit.s0.mean(1)) == pytest.approx(1000, rel=0.05)
    assert (fit.flags == 0).all()
    assert np.median(dispersion[:, 0]) < 0.02


@pytest.mark.parametrize("angle", [45, 60, 75, 90])
def test_crossing_fibres_are_resolved(device, angle):
    rng = np.random.default_rng(angle)
    bvals, bvecs = gradient_table(rng)
    n = 48
    truth = crossing(rng, n, angle)
    signal = simulate(rng, bvals, bvecs, truth, np.full((n, 2), 0.35))
    fit = fit_ballstick(signal, bvals, bvecs, BallStickParams(n_fibres=3, **chain(device)), device=device)
    dyads, _ = fit.dyads()
    errors = crossing_errors(dyads, truth)
    fmean = fit.f.mean(axis=2)
    print(f"\n[{device}] {angle}° crossing: median error {np.median(errors):.2f}°, mean f = {fmean.mean(0).round(3)}")
    if angle >= 60:  # the requirement; 45° is reported, not required
        assert np.median(errors) <= 10.0
        assert np.median(fmean[:, 1]) > 0.2  # the second stick is kept, not shrunk away by ARD


def test_same_seed_same_samples_regardless_of_batching(device):
    rng = np.random.default_rng(3)
    bvals, bvecs = gradient_table(rng)
    signal = simulate(rng, bvals, bvecs, crossing(rng, 12, 70), np.full((12, 2), 0.3))
    params = BallStickParams(n_fibres=2, burnin=40, njumps=40, sample_every=4, seed=11)
    one = fit_ballstick(signal, bvals, bvecs, params, device=device)
    batched = fit_ballstick(signal, bvals, bvecs, params, device=device, batch_voxels=5)
    np.testing.assert_array_equal(one.theta, batched.theta)
    np.testing.assert_array_equal(one.f, batched.f)
    other = fit_ballstick(signal, bvals, bvecs, BallStickParams(**{**params.__dict__, "seed": 12}), device=device)
    assert not np.array_equal(one.theta, other.theta)


def test_progress_and_cancel_between_batches(device):
    from tractlens.gpu.backend import Cancelled

    rng = np.random.default_rng(6)
    bvals, bvecs = gradient_table(rng)
    signal = simulate(rng, bvals, bvecs, unit(rng.normal(size=(12, 1, 3))), np.full((12, 1), 0.5))
    params = BallStickParams(n_fibres=1, burnin=10, njumps=10, sample_every=2)
    seen = []
    fit_ballstick(
        signal, bvals, bvecs, params, device=device, batch_voxels=4, progress=lambda d, t: seen.append((d, t))
    )
    assert seen == [(4, 12), (8, 12), (12, 12)]
    seen.clear()
    with pytest.raises(Cancelled):
        fit_ballstick(
            signal,
            bvals,
            bvecs,
            params,
            device=device,
            batch_voxels=4,
            progress=lambda d, t: seen.append(d),
            cancelled=lambda: bool(seen),
        )
    assert seen == [4]


def test_bad_voxels_are_flagged_and_left_zero(device):
    rng = np.random.default_rng(4)
    bvals, bvecs = gradient_table(rng)
    signal = simulate(rng, bvals, bvecs, unit(rng.normal(size=(6, 1, 3))), np.full((6, 1), 0.5))
    signal[1, 5] = np.nan
    signal[3] = 0.0
    fit = fit_ballstick(
        signal, bvals, bvecs, BallStickParams(n_fibres=2, burnin=20, njumps=20, sample_every=2), device=device
    )
    assert fit.flags[1] & FLAG_NOT_FITTED and fit.flags[3] & FLAG_NOT_FITTED
    assert (fit.flags[[0, 2, 4, 5]] == 0).all()
    assert not fit.theta[[1, 3]].any() and not fit.s0[[1, 3]].any()
    assert np.isfinite(fit.theta).all() and (fit.f[[0, 2, 4, 5], 0] > 0).all()


def test_rician_noise_model(device):
    rng = np.random.default_rng(5)
    bvals, bvecs = gradient_table(rng)
    n = 32
    dirs = unit(rng.normal(size=(n, 1, 3)))
    signal = simulate(rng, bvals, bvecs, dirs, np.full((n, 1), 0.6), snr=20)
    fit = fit_ballstick(signal, bvals, bvecs, BallStickParams(n_fibres=2, rician=True, **chain(device)), device=device)
    dyads, _ = fit.dyads()
    assert np.median(axial_error(dyads[:, 0], dirs[:, 0])) <= 5.0
    sigma = np.sqrt(1.0 / np.median(fit.tau.mean(1)))
    assert sigma == pytest.approx(1000 / 20, rel=0.25)  # the noise level is recovered


def test_unusable_settings_and_tables_are_refused(rng):
    with pytest.raises(ValueError, match="n_fibres"):
        BallStickParams(n_fibres=4)
    with pytest.raises(ValueError, match="sample_every"):
        BallStickParams(njumps=10, sample_every=25)
    bvals, bvecs = gradient_table(rng, shells=((1000, 6),))
    with pytest.raises(ValueError, match="cannot determine 3 sticks"):
        fit_ballstick(np.ones((2, len(bvals))), bvals, bvecs, device="cpu")


# ---------------------------------------------------------------- CUDA kernels vs NumPy


@pytest.mark.gpu
def test_lm_kernel_reaches_the_reference_optimum():
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.ballstick_fit import initial_x
    from tractlens.gpu.ballstick_lm import lm_kernel
    from tractlens.gpu.dti import fit_dti

    backend = get_backend("gpu")
    rng = np.random.default_rng(8)
    bvals, bvecs = gradient_table(rng)
    n = 200
    signal = simulate(rng, bvals, bvecs, crossing(rng, n, 75), np.full((n, 2), 0.3))
    dti = fit_dti(signal, bvals, bvecs, device="cpu")
    y = signal / dti.s0[:, None]
    b = bvals / bvals.max()
    x0 = initial_x(np, dti, 2, bvals.max())
    _, cost_ref = lm_numpy(y, b, bvecs, x0, 2, 200)
    params = BallStickParams(n_fibres=2)
    _, cost = lm_kernel(backend, backend.asarray(y.astype(np.float32)), b, bvecs, backend.asarray(x0), params)
    cost = backend.to_host(cost)
    # float32 model evaluation: the same optimum to ~1e-4 relative in nearly every voxel.
    close = np.abs(cost - cost_ref) <= 1e-3 * cost_ref + 1e-7
    assert close.mean() >= 0.95, np.sort(np.abs(cost - cost_ref) / cost_ref)[-10:]


@pytest.mark.gpu
@pytest.mark.parametrize("rician", [False, True])
def test_mcmc_kernel_tracks_the_reference_step_by_step(rician):
    """Same start, same Philox streams: the first sweeps of the kernel (float32) and of the
    reference (float64) make the same accept/reject decisions in nearly every voxel."""
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.ballstick_mcmc import mcmc_kernel

    backend = get_backend("gpu")
    rng = np.random.default_rng(9)
    bvals, bvecs = gradient_table(rng)
    n = 256
    truth = crossing(rng, n, 80)
    signal = simulate(rng, bvals, bvecs, truth, np.full((n, 2), 0.3))
    y = signal / 1000.0
    b = bvals / bvals.max()
    params = BallStickParams(n_fibres=3, burnin=0, njumps=3, sample_every=1, rician=rician, seed=5)
    th, ph = vectors_to_angles(np, truth)
    start = [np.ones(n), np.full(n, 1.5e-3 * bvals.max())]
    for i in range(2):
        start += [th[:, i], ph[:, i], np.full(n, 0.3)]
    start += [th[:, 0] + 0.5, ph[:, 0], np.full(n, 0.02)]
    if rician:
        start.append(np.full(n, 900.0))
    start = np.stack(start, 1)
    ref, ref_rate = mcmc_numpy(y, b, bvecs, start, np.arange(n, dtype=np.uint64), params)
    gpu, rate = mcmc_kernel(backend, backend.asarray(y.astype(np.float32)), b, bvecs, backend.asarray(start), 0, params)
    gpu = backend.to_host(gpu)
    same = np.isclose(gpu, ref, rtol=1e-3, atol=1e-5).all(axis=(1, 2))
    assert same.mean() >= 0.97, same.mean()
    assert np.array_equal(backend.to_host(rate)[same], ref_rate[same])


@pytest.mark.gpu
def test_gpu_and_numpy_posteriors_agree_over_repeats():
    """The seed's validation: each engine fits three voxels (single fibre, 70° crossing,
    isotropic) R times with independent streams; the distributions of the posterior means
    and spreads over the repeats agree within Monte-Carlo error."""
    rng = np.random.default_rng(10)
    bvals, bvecs = gradient_table(rng)
    repeats = 120
    dirs = np.concatenate([crossing(rng, 1, 90)[:, :1].repeat(2, 1), crossing(rng, 1, 70), crossing(rng, 1, 90)])
    fractions = np.array([[0.6, 0.0], [0.35, 0.35], [0.02, 0.0]])
    voxels = simulate(rng, bvals, bvecs, dirs, fractions)  # one noise draw per voxel, fitted R times
    signal = np.repeat(voxels, repeats, axis=0)
    params = BallStickParams(n_fibres=2, seed=1)
    fits = {dev: fit_ballstick(signal, bvals, bvecs, params, device=dev) for dev in ("gpu", "cpu")}
    report = []
    for dev, fit in fits.items():
        stats = {
            "S0": fit.s0,
            "d": fit.d * 1e3,
            "f1": fit.f[:, 0],
            "f2": fit.f[:, 1],
        }
        fits[dev] = {k: (v.mean(1).reshape(3, repeats), v.std(1).reshape(3, repeats)) for k, v in stats.items()}
        dyads, dispersion = fit.dyads()
        fits[dev]["dispersion1"] = (dispersion[:, 0].reshape(3, repeats), None)
        angle = axial_error(dyads[:, 0], np.repeat(dirs[:, 0], repeats, axis=0))
        fits[dev]["angle1"] = (angle.reshape(3, repeats), None)
    for key in ("S0", "d", "f1", "f2", "dispersion1", "angle1"):
        for which in (0, 1):
            g, c = fits["gpu"][key][which], fits["cpu"][key][which]
            if g is None:
                continue
            se = np.sqrt(g.var(1) / repeats + c.var(1) / repeats)
            diff = np.abs(g.mean(1) - c.mean(1))
            report.append((key, "mean" if which == 0 else "sd", diff, se))
            assert (diff <= 4.5 * se + 1e-3 * np.abs(c.mean(1)) + 1e-6).all(), (key, which, diff, se)
    for row in report:
        print(row)


# ---------------------------------------------------------------- files and command line


@pytest.fixture(scope="module")
def small_dwi(tmp_path_factory):
    """A 5x4x3 DWI on a neurological (det > 0) grid, one oblique fibre along voxel axes
    (1, 1, 0)/√2 in the left half and (0, 0, 1) in the right; FSL bvecs (x negated)."""
    from tractlens.app.io import save_gradients, save_volume

    rng = np.random.default_rng(12)
    bvals, bvecs_voxel = gradient_table(rng)
    folder = tmp_path_factory.mktemp("dwi")
    shape = (5, 4, 3)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    dirs = np.zeros((*shape, 1, 3))
    dirs[:2, ..., 0, :] = unit(np.array([1.0, 1.0, 0.0]))
    dirs[2:, ..., 0, :] = [0.0, 0.0, 1.0]
    flat = dirs.reshape(-1, 1, 3)
    signal = simulate(rng, bvals, bvecs_voxel, flat, np.full((len(flat), 1), 0.6), snr=50)
    save_volume(signal.reshape(*shape, -1).astype(np.float32), affine, folder / "dwi.nii.gz")
    save_gradients(bvals, bvecs_voxel, affine, folder / "dwi.bval", folder / "dwi.bvec")
    save_volume(np.ones(shape, np.uint8), affine, folder / "mask.nii.gz")
    return folder, dirs


def test_pipeline_writes_a_bedpostx_folder_that_reads_back(small_dwi, tmp_path):
    from tractlens.app.io import load_bedpostx, load_dwi
    from tractlens.app.io.bedpostx import BEDPOSTX_OUTPUTS
    from tractlens.app.pipelines.ballstick import fit_ballstick_pipeline, write_ballstick_outputs

    folder, dirs = small_dwi
    dwi = load_dwi(folder / "dwi.nii.gz")
    mask = np.ones(dwi.shape3, bool)
    mask[4, 3, 2] = False
    params = BallStickParams(n_fibres=2, **SHORT)
    result = fit_ballstick_pipeline(dwi, mask=mask, params=params, device="cpu")
    files = write_ballstick_outputs(result, tmp_path / "bpx")
    expected = {name.format(i=i) for name in BEDPOSTX_OUTPUTS for i in (1, 2)}
    assert expected | {"fit_ballstick.json"} == set(files)
    back = load_bedpostx(tmp_path / "bpx")
    np.testing.assert_array_equal(back.theta, result.samples.theta)
    np.testing.assert_array_equal(back.phi, result.samples.phi)
    np.testing.assert_array_equal(back.f, result.samples.f)
    np.testing.assert_array_equal(back.mask, mask)
    np.testing.assert_allclose(back.affine, dwi.affine)
    assert back.theta.shape == (5, 4, 3, 2, params.n_samples)
    assert not back.theta[4, 3, 2].any()  # outside the mask

    # FSL's frame: on a det > 0 grid the dyads are the voxel-axis directions with x negated.
    import nibabel as nib

    dyads1 = nib.load(tmp_path / "bpx" / "dyads1.nii.gz").get_fdata()
    fsl = dirs[..., 0, :] * [-1, 1, 1]
    assert np.median(axial_error(dyads1[mask], fsl[mask])) < 5.0
    # ... and the display volume turns them back into voxel axes, with the mean fraction.
    volume = result.dyads()
    assert volume.kind == "dyads" and volume.data.shape == (5, 4, 3, 2, 4)
    assert np.median(axial_error(volume.data[mask][:, 0, :3], dirs[mask][:, 0])) < 5.0
    assert np.median(volume.data[mask][:, 0, 3]) == pytest.approx(0.6, abs=0.08)
    mean_f1 = nib.load(tmp_path / "bpx" / "mean_f1samples.nii.gz").get_fdata()
    np.testing.assert_allclose(mean_f1, result.samples.f[..., 0, :].mean(-1), rtol=1e-6)
    bvecs_file = np.loadtxt(tmp_path / "bpx" / "bvecs")
    np.testing.assert_allclose(bvecs_file, np.loadtxt(folder / "dwi.bvec"), atol=1e-6)


def test_fit_ballstick_command(small_dwi, tmp_path):
    import json

    from tests.test_cli import run_cli

    folder, _ = small_dwi
    out = tmp_path / "subject.bedpostX"
    args = ["fit-ballstick", str(folder / "dwi.nii.gz"), "--mask", str(folder / "mask.nii.gz"), "--nfibres", "2"]
    args += ["--burnin", "40", "--njumps", "60", "--sampleevery", "6", "--device", "cpu", "--seed-rng", "3"]
    result = run_cli(*args, "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["voxels_fitted"] == 60 and summary["samples"] == 10 and summary["backend"] == "cpu"
    assert summary["params"]["seed"] == 3 and summary["params"]["n_fibres"] == 2
    assert (out / "merged_th2samples.nii.gz").exists() and (out / "dyads1_dispersion.nii.gz").exists()
    assert "fit-ballstick: 100.0%" in result.stderr
    again = run_cli(*args, "-o", str(tmp_path / "again"), "--quiet")
    assert again.returncode == 0, again.stderr
    import nibabel as nib

    first = nib.load(out / "merged_ph1samples.nii.gz").get_fdata()
    second = nib.load(tmp_path / "again" / "merged_ph1samples.nii.gz").get_fdata()
    np.testing.assert_array_equal(first, second)  # --seed-rng makes runs reproducible


@pytest.mark.parametrize(
    "extra, expect",
    [
        (["--njumps", "10", "--sampleevery", "25"], "njumps (10) must be at least sample_every"),
        (["--ard-weight", "-1"], "ard_weight must be"),
        (["--mask", "EMPTY"], "mask is empty"),
        (["--bval", "SHORT"], "b-values for 68 volumes"),
        (["--device", "gpu"], "a GPU was requested but none can be used"),
    ],
)
def test_fit_ballstick_bad_inputs(small_dwi, tmp_path, extra, expect):
    from tests.test_cli import _expect_input_error
    from tractlens.app.io import save_volume

    folder, _ = small_dwi
    save_volume(np.zeros((5, 4, 3), np.uint8), np.diag([2.0, 2, 2, 1]), tmp_path / "empty.nii.gz")
    np.savetxt(tmp_path / "short.bval", np.zeros((1, 10)))
    extra = [{"EMPTY": str(tmp_path / "empty.nii.gz"), "SHORT": str(tmp_path / "short.bval")}.get(a, a) for a in extra]
    _expect_input_error(
        "fit-ballstick",
        str(folder / "dwi.nii.gz"),
        *extra,
        "-o",
        str(tmp_path / "o"),
        match=expect,
        env={"TRACTLENS_DISABLE_GPU": "1"},
    )
    assert not (tmp_path / "o").exists()


def test_too_few_directions_for_the_sticks(small_dwi, tmp_path):
    import nibabel as nib

    from tests.test_cli import _expect_input_error

    folder, _ = small_dwi
    keep = list(range(4)) + list(range(4, 14))  # 4 b=0 + 10 directions: 11 parameters for 3 sticks
    img = nib.load(folder / "dwi.nii.gz")
    nib.save(nib.Nifti1Image(img.get_fdata()[..., keep].astype(np.float32), img.affine), tmp_path / "few.nii.gz")
    np.savetxt(tmp_path / "few.bval", np.loadtxt(folder / "dwi.bval")[None, keep], fmt="%g")
    np.savetxt(tmp_path / "few.bvec", np.loadtxt(folder / "dwi.bvec")[:, keep])
    _expect_input_error(
        "fit-ballstick", str(tmp_path / "few.nii.gz"), "-o", str(tmp_path / "o"), match="cannot determine 3 sticks"
    )


@pytest.mark.gpu
def test_demo_phantom_bundles_and_crossing_on_the_gpu(demo_phantom):
    """The whole demo brain (31 k voxels, stick-zeppelin-ball signal, so the model is only
    approximate) at FSL's defaults, through the pipeline and the FSL-frame round trip:
    single-bundle voxels give their bundle's direction, the 90° crossing gives both."""
    from tractlens.app.io import DWI
    from tractlens.app.pipelines.ballstick import fit_ballstick_pipeline

    p = demo_phantom
    dwi = DWI(data=p.dwi, affine=p.affine, bvals=p.bvals, bvecs=p.bvecs)
    result = fit_ballstick_pipeline(dwi, mask=p.brain, device="gpu")
    sticks = result.dyads().data  # (X, Y, Z, 3, [vx, vy, vz, f]), voxel axes
    occ = p.occupancy
    single = (occ.max(-1) >= 0.6) & ((occ > 0.05).sum(-1) == 1)
    own = np.take_along_axis(p.directions, occ.argmax(-1)[..., None, None], axis=3)[..., 0, :]
    first = sticks[single][:, 0]
    single_error = np.where(first[:, 3] > 0, axial_error(first[:, :3] + (first[:, 3:] == 0), own[single]), 90.0)
    cross = (occ[..., 0] >= 0.4) & (occ[..., 1] >= 0.4)
    found = sticks[cross][:, 1, 3] > 0  # a second stick with mean fraction ≥ 0.05
    cross_error = crossing_errors(sticks[cross][found][..., :3], p.directions[cross][found][:, :2])
    print(
        f"\ndemo: {int(p.brain.sum())} voxels in {result.fit.provenance['total_s']:.2f} s; single-bundle "
        f"median error {np.median(single_error):.2f}° ({int(single.sum())} voxels); crossing: second stick "
        f"in {found.mean():.0%} of {int(cross.sum())} voxels, median error {np.median(cross_error):.2f}°"
    )
    assert np.median(single_error) <= 5.0
    assert found.mean() >= 0.8
    assert np.median(cross_error) <= 10.0
