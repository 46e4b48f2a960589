"""Check the shipped-kernel round trip against the real CuPy and NVRTC, on a machine WITHOUT a GPU.

    python3 -m venv /tmp/cupyvenv && /tmp/cupyvenv/bin/pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
    /tmp/cupyvenv/bin/python tests/benchmarks/kernel_keys_without_gpu.py

NVRTC compiles without a GPU, so this runs CuPy's own caching code (cupy._core.core.compile_with_cache
and cupy/cuda/compiler.py) for two kernels, one as CuPy compiles its own (its headers prepended) and
one as a RawModule (ours), each with the -I options CuPy assembles (its headers and CUDA's, the
latter found by cuda.pathfinder in NVIDIA's wheel beside CuPy), for sm_90:

1. build: packaging/build_kernels.py's capture records the keys while CuPy compiles and saves
   the files (loading them then fails: no driver), and assemble() writes the shipped build;
2. user: CuPy imported through ANOTHER path (a link), so its key names another header folder;
   CUDA's headers stay where they were (the wheel is not linked), as on the H100 test that failed
   with the first layout (the CUDA folder was relocated with CuPy's); app/kernel_cache.install()
   puts the build into an empty cache; CuPy must then find each kernel (it goes on to load it,
   and fails for want of a driver) instead of compiling it;
3. the same without the install: CuPy compiles (the check can fail).

Prints PASS or FAIL per step; exit status 0 when all pass. Result of 2026-11-27 (CuPy 14.2.0,
NVRTC 12.9.86, nvidia-cuda-runtime-cu12 12.9.79, Python 3.11): PASS, PASS, PASS; with the
manifest layout 1 (CUDA's folder relocated as part of CuPy's site-packages): PASS, FAIL, PASS.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SIDE = r"""
import os, sys, atexit, importlib.util
from pathlib import Path
sys.path.insert(0, ROOT)
spec = importlib.util.spec_from_file_location("build_kernels", os.path.join(ROOT, "packaging", "build_kernels.py"))
bk = importlib.util.module_from_spec(spec); spec.loader.exec_module(bk)
import cupy
from cupy.cuda import compiler
from cupy._core import core
from tractlens.app import kernel_cache as kc
# no GPU: the per-device memos of the architecture ask the driver; their values for sm_90
compiler._get_arch = lambda: "90"
compiler._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch=sm_{arch or 90}", "cubin")
# through core.compile_with_cache, as ElementwiseKernel/ReductionKernel (CuPy's headers prepended)
# and RawModule (ours: not prepended) do: CuPy assembles the -I options of its headers and of CUDA's
sources = [('extern "C" __global__ void f(float* x) { x[threadIdx.x] *= 2; }', True),
           ('extern "C" __global__ void g(double* x) { x[threadIdx.x] += 1; }', False)]
work = Path(WORK)
print("options", core.assemble_cupy_compiler_options(()))

def compile_all():
    seen = []
    for src, own in sources:
        try:
            core.compile_with_cache(src, ("--std=c++17",) if not own else (), prepend_cupy_headers=own)
            seen.append("found")  # with a GPU (sm_90) it loads
        except Exception as exc:
            seen.append("compiled" if "WOULD COMPILE" in str(exc) else "found")  # found: load failed, no driver
    return seen

if SIDE == "build":
    save = bk._install_capture(work / "records")
    compile_all()
    save(); atexit.unregister(save)
    summary = bk.assemble(work / "records", Path(os.environ["CUPY_CACHE_DIR"]), work / "shipped")
    print("RESULT", "PASS" if list(summary) == ["cupy%s-nvrtc%d.%d-sm90" % (cupy.__version__, *cupy.cuda.nvrtc.getVersion())] else "FAIL", summary)
else:
    here = os.path.dirname(os.path.abspath(core.__file__))
    assert here.startswith(str(work / "elsewhere")), here
    if SIDE == "user":
        runtime = kc.Runtime(cupy.__version__, tuple(cupy.cuda.nvrtc.getVersion()), "90", here, kc.cupy_include_dirs(core))
        print(runtime.include_dirs, kc.install(runtime, shipped=work / "shipped", banner=lambda: kc.compiler_banner("90")))
    def refuse(*args, **kwargs):
        raise RuntimeError("WOULD COMPILE")
    compiler._compile_using_nvrtc_no_warning = refuse
    seen = compile_all()
    expected = ["found"] * 2 if SIDE == "user" else ["compiled"] * 2
    print("RESULT", "PASS" if seen == expected else "FAIL", seen)
"""


def main() -> int:
    import cupy

    work = Path(tempfile.mkdtemp(prefix="kernel-keys-"))
    (work / "records").mkdir()
    (work / "elsewhere").mkdir()
    (work / "elsewhere" / "cupy").symlink_to(Path(cupy.__file__).parent, target_is_directory=True)
    ok = True
    for side, cache, path in (
        ("build", "build", ""),
        ("user", "user", str(work / "elsewhere")),
        ("none", "none", str(work / "elsewhere")),
    ):
        code = f"ROOT = {str(ROOT)!r}; WORK = {str(work)!r}; SIDE = {side!r}\n" + SIDE
        keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # no CuPy there (checked)
        env = {
            **os.environ,
            "CUPY_CACHE_DIR": str(work / cache),
            "PYTHONPATH": os.pathsep.join(p for p in [path, *keep] if p),
        }
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
        print(f"{side}: {lines[-1] if lines else 'FAIL ' + done.stderr[-800:]}")
        ok &= bool(lines) and "PASS" in lines[-1]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
