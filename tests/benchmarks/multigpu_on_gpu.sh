#!/usr/bin/env bash
# Several GPUs of one host (issue "Several GPUs"), on the 2- or 4-GPU machine (repository root),
# results under $OUT:
#   1. the multi-device tests: simulated GPUs (CPU) and the gpu-marked ones (two shares of one GPU,
#      and every GPU) of the split probabilistic run, the omatrix3 split, COMMIT's split operator;
#   2. bench_multigpu.py: probabilistic 102 M on 1..N GPUs with each device's stages, omatrix3
#      500 M on N (1 GPU on 125 M), COMMIT (fits one GPU: 1 vs N; 10 M streamlines / 4 G segments
#      on 4, 2.5 M per GPU on fewer) -> $OUT/multigpu_<gpu>x<N>.json (about 5 minutes on 4 GPUs);
#   3. with BATCH=1 and the cohort wheels in .whlB/ or .whlD/ (see below): bench_batch.py,
#      batch --gpus 1,2,4, with each subject-step's phases per GPU -> $OUT/batch_<gpu>.json
#      (TRACTLENS_WORKER_AFFINITY=off: the workers not pinned to their GPUs' CPUs, to compare).
#   4. with TRX=1: bench_trx_write.py, 1 and 4 concurrent .trx writers of an HCP subject's 310 M
#      points (16 threads each, as batch --gpus 4 gives), the disk's writes started early and not
#      -> $OUT/trx_write_early.json, $OUT/trx_write_at_close.json (about 2 minutes).
# FIRST_TOUCH=1 times fresh and reused host memory, 1 and 4 processes at once; WARM_GB=N touches N GB
# of host memory (8 processes) before the batch runs, as a machine up for a while has. BATCH_TIMEOUT: the
# cohort benchmark's seconds (540); BATCH_ARGS="--gpu-counts 1,4 --repeat 2 --warmup": interleaved rounds, medians.
# PARTS=prob,omatrix3,commit picks benchmark parts; TESTS=0 skips the tests, BENCH=0 the benchmark.
# The machine has numpy, scipy, cupy and h5py: carry nibabel and trx-python (cp312) in .whl/, and for
# BATCH=1 the cohort extra's wheels in .whlB/ (dask-cuda is not needed: without it batch --gpus N
# runs a LocalCluster with one worker process pinned to each GPU):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whlB \
#     dask==2026.8.0 distributed==2026.8.0 cloudpickle fsspec partd locket toolz pyyaml click msgpack \
#     psutil sortedcontainers tblib tornado zict jinja2 markupsafe pybids bids-validator bidsschematools \
#     acres docopt formulaic interface-meta narwhals num2words pandas python-dateutil six tzdata \
#     sqlalchemy greenlet universal-pathlib pathlib-abc wrapt frozendict typing_extensions packaging isal
set -u
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
cohort=.whlD; ls .whlD/*.whl >/dev/null 2>&1 || cohort=.whlB  # the cohort wheels: .whlD if carried, else .whlB
for dir in .whl $cohort; do
  if [ "$dir" != .whl ] && [ "${BATCH:-0}" != 1 ]; then continue; fi
  if ls $dir/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $dir/*.whl || exit 1
  fi
done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
{ nvidia-smi topo -m; lscpu | grep -i -E "numa|socket|model name"; } > "$OUT/topology.txt" 2>&1  # which CPUs each GPU is near
if [ "${TESTS:-1}" != 0 ]; then
  python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/test_multidevice.py \
    tests/test_multidevice_failures.py tests/test_multidevice_merge.py tests/test_connectome_split.py \
    tests/test_commit_multi.py ${EXTRA_TESTS:-} 2>&1 \
    | tee "$OUT/pytest_multigpu.log" | tail -8
fi
[ "${BENCH:-1}" != 0 ] && timeout 480 python3 tests/benchmarks/bench_multigpu.py --parts "${PARTS:-prob,omatrix3,commit}" --out \
  "$OUT/multigpu_$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE '[A-Z]+[0-9]{2,4}' | head -1 | tr A-Z a-z)x$(nvidia-smi -L | wc -l).json" \
  2>&1 | tee "$OUT/bench_multigpu.log" | grep -v '^ ' | tail -40
if [ -n "${FIRST_TOUCH:-}" ]; then  # host memory's first touch, 1 and 4 processes (bench_first_touch.py)
  python3 tests/benchmarks/bench_first_touch.py --gb 8 --procs 4 --rounds 2 --out "$OUT/first_touch.json"
fi
if [ -n "${WARM_GB:-}" ]; then  # touch (and free) this much host memory first, as a host up for a while has
  python3 tests/benchmarks/bench_first_touch.py --warm "$WARM_GB" --warm-procs 8 --rounds 0 --out "$OUT/warm.json"
fi
if [ "${BATCH:-0}" = 1 ]; then
  timeout "${BATCH_TIMEOUT:-540}" python3 tests/benchmarks/bench_batch.py --no-cpu --gpu-counts 1,2,4 --subjects-per-gpu 2 ${BATCH_ARGS:-} \
    --results "$OUT" 2>&1 | tail -20
fi
if [ "${TRX:-0}" = 1 ]; then
  for wb in 256 0; do
    name=early; [ $wb = 0 ] && name=at_close
    timeout 240 python3 tests/benchmarks/bench_trx_write.py --points 310e6 --writers 1,4 --threads 16 \
      --writeback-mb $wb --folder "${TRX_FOLDER:-/tmp/tractlens-trx-bench}" --out "$OUT/trx_write_$name.json" 2>&1 | tail -3
  done
fi
