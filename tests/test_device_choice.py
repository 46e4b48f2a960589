"""``device="auto"`` chooses the CPU or the GPU by measured cost: the rule, with a stand-in model."""

import math

import pytest

from tractlens.gpu import engines
from tractlens.gpu.engines import CostModel, DeviceChoice, GpuState, MethodCost, choose_device, decide_device

# CPU 1 µs a unit; GPU 0.1 µs a unit + 0.1 s overhead; import 1 s, compile 2 s, load 0.5 s.
MODEL = CostModel(
    methods={
        "fit": MethodCost("voxels", 1e-6, 1e-7, gpu_overhead_s=0.1, compile_s=2.0, load_s=0.5, kernel_files=("fit.cu",))
    },
    import_s=1.0,
)
COLD = GpuState(imported=False, cached=False)  # fresh process, empty kernel cache: 1 + 2 + 0.1 s
CACHED = GpuState(imported=False, cached=True)  # fresh process, kernels on disk: 1 + 0.5 + 0.1 s
WARM = GpuState(imported=True, loaded=frozenset({"fit.cu"}))  # this process ran it: 0.1 s
NO_GPU = GpuState(available=False, reason="CuPy is not installed")


def crossover(startup_s: float) -> float:
    return (startup_s + 0.1) / (1e-6 - 1e-7)


@pytest.mark.parametrize(
    ("state", "startup_s"), [(COLD, 3.0), (CACHED, 1.5), (WARM, 0.0), (GpuState(imported=True, cached=False), 2.0)]
)
def test_the_crossover_is_where_the_gpu_repays_its_start_up(state, startup_s):
    assert MODEL.startup_seconds("fit", state) == pytest.approx(startup_s)
    assert MODEL.crossover("fit", state) == pytest.approx(crossover(startup_s), rel=1e-9)


@pytest.mark.parametrize("state", [COLD, CACHED, WARM])
def test_auto_takes_the_cpu_below_the_crossover_and_the_gpu_above(state):
    n = MODEL.crossover("fit", state)
    assert choose_device("fit", 0.9 * n, cost_model=MODEL, state=state) == "cpu"
    assert choose_device("fit", 1.1 * n, cost_model=MODEL, state=state) == "gpu"


def test_a_warm_process_gives_the_gpu_work_a_cold_one_keeps_on_the_cpu():
    n = 1e6  # 1 s on the CPU; 3.2 s on a cold GPU, 0.2 s on a warm one
    assert choose_device("fit", n, cost_model=MODEL, state=COLD) == "cpu"
    assert choose_device("fit", n, cost_model=MODEL, state=WARM) == "gpu"


def test_the_warm_up_counts_as_warm_for_every_method():
    warmed = GpuState(imported=True, warmed=True)
    assert MODEL.startup_seconds("fit", warmed) == 0.0
    assert choose_device("fit", 1e6, cost_model=MODEL, state=warmed) == "gpu"


@pytest.mark.parametrize("requested", ["cpu", "gpu"])
@pytest.mark.parametrize("n", [1, 1e12])
def test_forced_devices_are_obeyed_whatever_the_cost(requested, n):
    for state in (COLD, WARM, NO_GPU):
        choice = decide_device("fit", n, requested=requested, cost_model=MODEL, state=state)
        assert choice.device == requested
        assert choice.argument == requested


def test_auto_without_a_gpu_is_the_cpu_and_says_why():
    choice = decide_device("fit", 1e12, cost_model=MODEL, state=NO_GPU)
    assert choice.device == "cpu"
    assert "no usable GPU" in choice.reason and "CuPy is not installed" in choice.reason


def test_the_reason_names_the_size_and_the_crossover():
    choice = decide_device("fit", 12_000, cost_model=MODEL, state=COLD)
    assert choice.reason.startswith("cpu: 12 k voxels, below the GPU crossover (~3.44 M cold)")
    assert decide_device("fit", 1e9, cost_model=MODEL, state=WARM).reason.startswith("gpu: 1 G voxels, above")


def test_auto_that_picks_the_gpu_passes_auto_on_so_out_of_memory_still_falls_back():
    assert DeviceChoice("gpu", "", "auto").argument == "auto"
    assert DeviceChoice("cpu", "", "auto").argument == "cpu"


def test_a_method_without_a_model_keeps_the_old_rule_gpu_when_present():
    assert choose_device("unknown", 1, cost_model=MODEL, state=COLD) == "gpu"
    assert choose_device("fit", None, cost_model=MODEL, state=COLD) == "gpu"


def test_a_gpu_never_faster_per_unit_never_wins():
    slow = CostModel(methods={"fit": MethodCost("voxels", 1e-7, 1e-6)}, import_s=0.0)
    assert math.isinf(slow.crossover("fit", WARM))
    assert choose_device("fit", 1e15, cost_model=slow, state=WARM) == "cpu"


def test_every_pipeline_method_has_a_default_cost():
    expected = {"fit-dti", "fit-ballstick", "deterministic", "geodesic", "probabilistic", "commit", "select"}
    expected |= {"connectome", "profile", "distance", "fit-csd"}
    assert set(engines.DEFAULT_COSTS.methods) == expected
    for cost in engines.DEFAULT_COSTS.methods.values():
        assert cost.cpu_s_per_unit > cost.gpu_s_per_unit > 0


def test_gpu_state_without_cupy_is_unavailable_and_does_not_import_it(monkeypatch):
    import sys

    monkeypatch.delenv("TRACTLENS_DISABLE_GPU", raising=False)
    engines.gpu_status.cache_clear()  # an earlier test's probe (with CuPy absent) would answer in its words
    state = engines.gpu_state()
    if "cupy" not in sys.modules and not state.available:
        assert "CuPy" in state.reason
    monkeypatch.setenv("TRACTLENS_DISABLE_GPU", "1")
    assert engines.gpu_state().available is False


def test_a_fresh_process_pays_the_methods_first_use_once():
    model = CostModel(
        methods={
            "track": MethodCost(
                "seeds",
                1e-6,
                1e-8,
                compile_s=2.0,
                load_s=0.5,
                kernel_files=("track.cu",),
                first_use_s=3.0,
                gpu_overhead_s=0.0,
            )
        },
        import_s=1.0,
    )
    assert model.startup_seconds("track", CACHED) == pytest.approx(1.0 + 3.0 + 0.5)
    assert model.startup_seconds("track", COLD) == pytest.approx(1.0 + 3.0 + 2.0)
    imported = GpuState(imported=True, cached=True)  # CuPy and the pipeline already ran here
    assert model.startup_seconds("track", imported) == pytest.approx(0.5)
    assert choose_device("track", 4.0e6, cost_model=model, state=CACHED) == "cpu"  # 4 s CPU vs 4.54 s GPU
    assert choose_device("track", 4.0e6, cost_model=model, state=imported) == "gpu"
