"""One engine chooser for every method: ``auto`` resolution, validation and one error message."""

from types import SimpleNamespace

import numpy as np
import pytest

from tractlens.gpu import (
    ballstick_fit,
    deterministic,
    dti,
    geodesic,
    geodesic_field,
    probabilistic,
    probabilistic_params,
    select,
)
from tractlens.gpu.engines import ARRAYS, KERNEL, NUMPY, choose_engine, engine_names

CPU = SimpleNamespace(is_gpu=False)
GPU = SimpleNamespace(is_gpu=True)


@pytest.mark.parametrize(
    ("available", "backend", "expected"),
    [
        ((KERNEL, ARRAYS), GPU, KERNEL),
        ((KERNEL, ARRAYS), CPU, ARRAYS),
        ((KERNEL, NUMPY), GPU, KERNEL),
        ((KERNEL, NUMPY), CPU, NUMPY),
        ((ARRAYS,), GPU, ARRAYS),
    ],
)
def test_auto_is_the_kernel_on_the_gpu_and_the_cpu_engine_otherwise(available, backend, expected):
    assert choose_engine("auto", backend, available=available) == expected


@pytest.mark.parametrize("backend", [CPU, GPU])
def test_an_explicit_cpu_engine_runs_on_either_backend(backend):
    assert choose_engine("arrays", backend) == ARRAYS
    assert choose_engine("numpy", backend, available=(KERNEL, NUMPY)) == NUMPY


def test_the_kernel_on_the_cpu_is_refused_with_the_cpu_alternative():
    with pytest.raises(ValueError, match=r"'kernel' engine needs the GPU.*tracking.*engine='numpy'"):
        choose_engine("kernel", CPU, available=(KERNEL, NUMPY), method="tracking")
    assert choose_engine("kernel", GPU) == KERNEL


@pytest.mark.parametrize("requested", ["gpu", "cuda", "", "Kernel", "numpy"])
def test_an_unknown_engine_names_the_method_and_the_choices(requested):
    with pytest.raises(ValueError, match=r"unknown engine .* for fitting: use one of 'auto', 'kernel', 'arrays'"):
        choose_engine(requested, GPU, method="fitting")


def test_a_kernel_only_method_has_no_cpu_engine():
    with pytest.raises(ValueError, match="only the 'kernel' engine"):
        choose_engine("auto", CPU, available=(KERNEL,))


def test_a_method_cannot_offer_an_engine_outside_the_vocabulary():
    with pytest.raises(ValueError, match="engines must be among"):
        choose_engine("auto", CPU, available=("cpu",))


def test_engine_names_lists_auto_first():
    assert engine_names() == ("auto", "kernel", "arrays")
    assert deterministic.ENGINES == ("auto", "kernel", "compiled", "arrays")


# Every method resolves its engine through choose_engine: same messages everywhere.
def _deterministic(engine):
    tensor = np.zeros((3, 3, 3, 6), np.float32)
    tensor[..., 0] = 1.0
    return list(deterministic.track(tensor, [[1.0, 1.0, 1.0]], device="cpu", engine=engine))


def _geodesic(engine):
    tensor = np.zeros((3, 3, 3, 6))
    tensor[..., [0, 3, 5]] = 1.0
    fld = geodesic_field.prepare_metric(tensor, (1.0, 1.0, 1.0))
    return list(geodesic.track(fld, [[1.0, 1.0, 1.0]], [[1.0, 0.0, 0.0]], device="cpu", engine=engine))


def _probabilistic(engine):
    field_ = probabilistic_params.SampleField.from_grid(
        np.tile([1.0, 0.0, 0.0], (2, 2, 2, 1, 2, 1)).astype(np.float32),
        np.full((2, 2, 2, 1, 2), 0.5, np.float32),
        np.ones((2, 2, 2), bool),
        (1.0, 1.0, 1.0),
    )
    bits = probabilistic_params.mask_bits(np.ones((2, 2, 2), bool))
    params = probabilistic_params.ProbParams(n_samples=2, n_steps=3)
    return probabilistic.track(field_, bits, [[0, 0, 0]], params, device="cpu", engine=engine)


def _ballstick(engine):
    bvals = np.array([0.0] + [1000.0] * 12)
    bvecs = np.vstack([[0, 0, 0], np.eye(3).repeat(4, axis=0)])
    return ballstick_fit.fit_ballstick(np.ones((1, 13)), bvals, bvecs, device="cpu", engine=engine)


def _select(engine):
    points = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], np.float32)
    masks = [np.ones((2, 2, 2), bool)]
    return select.select_streamlines(points, np.array([0, 2]), masks, device="cpu", engine=engine)


def _dti(engine):
    bvals = np.array([0.0] + [1000.0] * 6)
    bvecs = np.vstack([[0, 0, 0], np.eye(3), np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]]) / np.sqrt(2)])
    return dti.fit_dti(np.ones((1, 7)), bvals, bvecs, dti.DTIFitParams(engine=engine), device="cpu")


@pytest.mark.parametrize(
    ("run", "cpu_engine"),
    [
        (_deterministic, "compiled"),
        (_geodesic, "arrays"),
        (_probabilistic, "compiled"),
        (_ballstick, "numpy"),
        (_select, "compiled"),
        (_dti, "arrays"),
    ],
)
def test_every_method_refuses_the_kernel_on_the_cpu_with_one_message(run, cpu_engine):
    with pytest.raises(ValueError, match=rf"the 'kernel' engine needs the GPU backend .*engine='{cpu_engine}'"):
        run("kernel")


@pytest.mark.parametrize("run", [_deterministic, _geodesic, _probabilistic, _ballstick, _select])
def test_every_method_rejects_an_unknown_engine_with_one_message(run):
    with pytest.raises(ValueError, match=r"unknown engine 'gpu' for .*: use one of 'auto', 'kernel'"):
        run("gpu")
