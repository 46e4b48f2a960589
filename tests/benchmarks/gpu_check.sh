#!/usr/bin/env bash
# Run on the GPU machine (repository root): gpu-marked tests, the whole suite with CuPy
# present, and the DTI benchmark. Logs and JSON go to $OUT (or ./bench-results).
set -u
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || echo "editable install failed (see install.log); console-script test will fail"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m tractlens info | tee -a "$OUT/gpu.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/gui 2>&1 | tee "$OUT/pytest_gpu.log" | tail -5
# The whole suite with CuPy present takes ~10 min on the GPU machine, more than one device call
# may run: SUITE=0 skips it (run it alone in a call of its own).
if [ "${SUITE:-1}" != 0 ]; then
  python3 -m pytest -m "not benchmark" -q -p no:cacheprovider --ignore=tests/gui 2>&1 | tee "$OUT/pytest_all.log" | tail -5
fi
for bench in ${BENCHES:-dti}; do
  case $bench in
    dti) python3 tests/benchmarks/bench_dti.py --gpu --hcp --end-to-end --out "$OUT/bench_dti.json" ;;
    deterministic) python3 tests/benchmarks/bench_deterministic.py --gpu --out "$OUT/bench_deterministic.json" ;;
    geodesic) python3 tests/benchmarks/bench_geodesic.py --gpu --out "$OUT/bench_geodesic.json" ;;
    commit) python3 tests/benchmarks/bench_commit.py --gpu --out "$OUT/bench_commit.json" ;;
    connectivity) python3 tests/benchmarks/bench_connectivity.py --gpu --cpu-max 100000 --out "$OUT/bench_connectivity.json" ;;
    probabilistic) python3 tests/benchmarks/bench_probabilistic.py --gpu --out "$OUT/bench_probabilistic.json" ;;
    bundles) python3 tests/benchmarks/bench_bundles.py --device gpu --out "$OUT/bundles_h100.json" ;;
    *) python3 "tests/benchmarks/bench_$bench.py" --gpu ;;
  esac 2>&1 | tee "$OUT/bench_$bench.log" | tail -40
done
