"""Constants shared by Python and the CUDA kernels are defined once, in Python.

No GPU needed: ``cuda.function`` is replaced by a recorder, every wrapper's kernel getter is
called, and what it would compile with is compared with the kernel sources, parsed.
"""

import re
from types import SimpleNamespace

import pytest

from tractlens.gpu import (
    ballstick,
    commit_device,
    cuda,
    deterministic,
    dti,
    fod_tracking,
    geodesic,
    geodesic_field,
    probabilistic_kernel,
    probabilistic_params,
    select,
    streamlines,
    tracking,
)

# Each wrapper's way to its kernels (pure Python up to cuda.function).
GETTERS = {
    "deterministic": lambda: deterministic._kernel(),
    "fod tracking": lambda: fod_tracking._kernel(),
    "geodesic": lambda: geodesic._kernel(),
    "dti float32": lambda: dti._cuda_function("dti_fit_float32"),
    "dti float64": lambda: dti._cuda_function("dti_fit_float64"),
    "select": lambda: select._kernel(),
    "streamlines": lambda: streamlines._pack_rows_kernel(),
    "ballstick lm": lambda: ballstick.compiled_kernel("ballstick_lm", ballstick.BallStickParams(), 65),
    "ballstick mcmc": lambda: ballstick.compiled_kernel("ballstick_mcmc", ballstick.BallStickParams(rician=True), 65),
    "commit": lambda: commit_device.kernels(
        SimpleNamespace(n_meas=90, n_ic=2, lut_ic=SimpleNamespace(shape=(2, 500, 90)))
    ),
    "probabilistic": lambda: probabilistic_kernel.kernel_function(False),
    "probabilistic seed matrix": lambda: probabilistic_kernel.kernel_function(True),
}


@pytest.fixture(scope="module")
def compiled():
    """What each getter asks ``cuda.function`` for: a list of (file, name, headers, defines)."""
    calls = {}
    original = cuda.function
    try:
        for label, getter in GETTERS.items():
            calls[label] = []

            def record(file, name, headers=(), defines=(), _calls=calls[label]):
                _calls.append((file, name, tuple(headers), tuple(defines)))
                return object()

            cuda.function = record
            getter()
    finally:
        cuda.function = original
    return calls


def _code(text: str) -> str:
    """The source without comments and string literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def _local_names(code: str) -> set[str]:
    """Names the source defines itself: macros and their parameters, types, template parameters."""
    names = set()
    for name, params in re.findall(r"^\s*#\s*define\s+(\w+)(?:\(([^)]*)\))?", code, flags=re.MULTILINE):
        names.add(name)
        names.update(p.strip() for p in params.split(",") if p.strip())
    names.update(re.findall(r"\bstruct\s+(\w+)", code))
    names.update(re.findall(r"\btypedef\b[^;]*?\b(\w+)\s*;", code))
    for params in re.findall(r"\btemplate\s*<([^>]*)>", code):
        names.update(re.findall(r"\b(?:int|bool|typename|class|unsigned)\s+(\w+)", params))
    return names


def _constants_used(code: str) -> set[str]:
    """Upper-case names of two or more characters the code uses outside the guards of required
    defines, not as members (single capitals are the formulas' variables: X, L, S)."""
    body = re.sub(r"^\s*#\s*(ifndef|error|endif)\b[^\n]*", " ", code, flags=re.MULTILINE)
    return set(re.findall(r"(?<![.\w>])[A-Z][A-Z0-9_]+\b", body))


def test_every_kernel_file_is_compiled_by_a_wrapper(compiled):
    files = {call[0] for calls in compiled.values() for call in calls}
    on_disk = {p.name for p in cuda.KERNEL_DIR.glob("*.cu")}
    assert files == on_disk
    for calls in compiled.values():
        for file, name, headers, _ in calls:
            assert re.search(rf"\b{name}\b", cuda.source(file, headers)), (file, name)


@pytest.mark.parametrize("label", list(GETTERS))
def test_a_wrapper_passes_exactly_the_defines_its_kernel_requires(compiled, label):
    assert compiled[label], f"{label} compiled nothing"
    for file, _, headers, defines in compiled[label]:
        names = [key for key, _ in defines]
        assert len(names) == len(set(names)), f"{file}: a define passed twice"
        assert set(names) == cuda.required_defines(file, headers), file
        for key, value in defines:
            assert isinstance(value, int) and not isinstance(value, bool), (file, key, value)


@pytest.mark.parametrize("label", list(GETTERS))
def test_every_constant_a_kernel_uses_comes_from_python(compiled, label):
    for file, _, headers, defines in compiled[label]:
        code = _code(cuda.source(file, headers))
        passed = {key for key, _ in defines}
        local = _local_names(code)
        assert not passed & local, f"{file} defines {sorted(passed & local)} itself as well"
        unknown = _constants_used(code) - passed - local
        assert not unknown, f"{file} uses {sorted(unknown)}: define them in Python and pass them"
        unused = passed - _constants_used(code)
        assert not unused, f"{file} is passed {sorted(unused)} but does not use them"


def test_kernels_guard_every_required_define_with_an_error():
    """A kernel compiled without its defines fails loudly instead of using a stale default."""
    for path in cuda.KERNEL_DIR.iterdir():
        code = _code(path.read_text())
        for name in re.findall(r"^\s*#\s*ifndef\s+(\w+)", code, flags=re.MULTILINE):
            assert name in cuda.required_defines(path.name), f"{path.name}: #ifndef {name} without #error"


def test_the_stop_codes_are_the_ones_python_reports():
    defines = dict(deterministic.KERNEL_DEFINES) | dict(geodesic.KERNEL_DEFINES)
    for name in ("MAX_LENGTH", "OUTSIDE_VOLUME", "OUTSIDE_MASK", "LOW_FA", "SHARP_ANGLE", "STOP_REGION"):
        assert defines[name] == getattr(streamlines, name)
    assert defines["MAX_STEPS"] == geodesic.MAX_STEPS == streamlines.MAX_STEPS
    assert defines["REACHED_TARGET"] == geodesic.REACHED_TARGET
    assert set(streamlines.STOP_REASONS) == {0, *streamlines.STOP_CODES.values()}
    assert defines["REGION_STOP"] == tracking.STOP and defines["TARGET_BIT"] == geodesic_field.TARGET
    assert dict(dti.KERNEL_DEFINES)["FLAG_FIT_FAILED"] == dti.FLAG_FIT_FAILED
    assert dict(probabilistic_kernel.kernel_defines())["TARGET_SHIFT"] == probabilistic_params.TARGET_SHIFT


def test_compiling_without_a_required_define_is_refused_before_the_compiler():
    with pytest.raises(ValueError, match=r"deterministic.cu needs the compile-time constants .*LOW_FA"):
        cuda.function("deterministic.cu", "track_deterministic", deterministic.KERNEL_HEADERS, ())
    with pytest.raises(ValueError, match="must be an integer"):
        cuda.check_defines("select.cu", (), (("X", 1.5),))


def test_the_least_squares_kernel_is_compiled_once_per_stick_count():
    """LM ignores the MCMC's constants: fixed values, so other measurement counts reuse it."""
    params = ballstick.BallStickParams(rician=True)
    assert ballstick.kernel_defines(params, 65, False) == ballstick.kernel_defines(params, 300, False)
    assert dict(ballstick.kernel_defines(params, 65, True)) == {
        "NFIB": params.n_fibres,
        "PER_LANE": 3,
        "RICIAN": 1,
        "MODEL2": 0,  # model 1 is the default
    }
