#!/usr/bin/env bash
# Issue 43's first run on the GPU machine (repository root): build the kernels ahead of time
# (packaging/build_kernels.py -> resources/kernel_cache/), then time every whole command of
# bench_e2e.py cold (an EMPTY kernel cache plus the shipped kernels, as on a fresh machine) against
# warm, and print cold/warm per command (target: cold <= 1.2 x warm). Results under $OUT.
#
# The machine has Python 3.12 with CuPy, NumPy and SciPy but no nibabel/trx and no network: carry
# their wheels (cp312) in .whl/ (git-ignored), made on a machine with pip:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     -d .whl nibabel trx-python deepdiff orderly-set typing_extensions packaging
#
# Steps (each fits one device call; the machine keeps /tmp/fr and resources/kernel_cache between
# calls while it stays warm):
#   bash tests/benchmarks/first_run_on_gpu.sh build      # wheels, the HCP-sized subject (~1.5 min), then the
#                                                        # kernels (~5 min: the small subjects, and fit-dti,
#                                                        # track-det and COMMIT on the HCP-sized one); 'subject'
#                                                        # makes only the subject (build then skips it)
#   bash tests/benchmarks/first_run_on_gpu.sh bench      # cold/warm of fit-dti, track-det, commit, track-prob(-wb)
#   bash tests/benchmarks/first_run_on_gpu.sh ballstick  # cold/warm of fit-ballstick (~3 min)
#   bash tests/benchmarks/first_run_on_gpu.sh test       # tests/test_kernel_cache_gpu.py (~3 min)
# BASELINE=1 with bench or ballstick also runs the same cold/warm without the shipped kernels (doubles its time).
# The cold runs' kernel cache starts empty except for the shipped kernels; each run's log says how many
# kernels CuPy compiled (bench_e2e.py's "kernels compiled" column).
set -u
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
FR=${FR:-/tmp/fr}
step=${1:-build}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/nibabel ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import cupy; print('cupy', cupy.__version__, 'nvrtc', cupy.cuda.nvrtc.getVersion(), 'sm', cupy.cuda.Device().compute_capability)" | tee -a "$OUT/gpu.txt"

case $step in
  subject | build)
    start=$(date +%s)
    if [ ! -e "$FR/prime.done" ]; then  # made once per machine (bench_e2e.py also keeps what it made)
      python3 tests/benchmarks/bench_e2e.py --outdir "$FR/e2e" --make-only 2>&1 | tail -2
      # bedpostX's data cache (TractLens's, not the compiler's) is built by a first read: build it now
      # so the cold runs below measure the kernels; --cold-data would measure it too
      python3 -m tractlens.app.cli track probabilistic --samples "$FR/e2e/bedpostx" --seed "$FR/e2e/seed.nii.gz" \
        --nsamples 1 -o "$FR/prime" --device cpu --quiet 2>&1 | tail -2 && touch "$FR/prime.done"
    fi
    echo "subject: $(($(date +%s) - start)) s"
    [ "$step" = subject ] && exit 0
    start=$(date +%s)
    # MEASUREMENTS=32,288 builds the catalogue only for the two subjects' counts (a minute less; a
    # release build keeps the default, 32 to 320). LARGE=0 leaves out the runs on the HCP-sized subject.
    large=()
    [ "${LARGE:-1}" = 1 ] && large=(--large-subject "$FR/e2e")
    python3 packaging/build_kernels.py --out resources/kernel_cache --work "$FR/kernels" "${large[@]}" \
      ${MEASUREMENTS:+--measurements "$MEASUREMENTS"} 2>&1 | tee "$OUT/build_kernels.log" | grep -v "^\[.*made " | tail -30
    echo "build_kernels: $(($(date +%s) - start)) s" | tee -a "$OUT/build_kernels.log"
    du -sh resources/kernel_cache/* | tee -a "$OUT/build_kernels.log"
    ;;
  bench | ballstick)
    [ -d resources/kernel_cache ] || { echo "run the build step first (resources/kernel_cache is missing)"; exit 1; }
    if [ "$step" = ballstick ]; then
      commands=${COMMANDS:-fit-ballstick}
      tag=h100_cold_shipped_ballstick
    else
      commands=${COMMANDS:-fit-dti,track-det,commit,track-prob,track-prob-wb}
      tag=h100_cold_shipped
    fi
    python3 tests/benchmarks/bench_e2e.py --outdir "$FR/e2e" --commands "$commands" --device gpu --cold \
      --kernel-cache "$FR/cold-cache" --results "$OUT" --tag "$tag" 2>&1 | tee -a "$OUT/bench_cold_$step.log" |
      grep -A12 "cold s"
    if [ "${BASELINE:-0}" = 1 ]; then
      python3 tests/benchmarks/bench_e2e.py --outdir "$FR/e2e" --commands "$commands" --device gpu --cold \
        --no-shipped-kernels --kernel-cache "$FR/cold-cache" --results "$OUT" --tag "${tag/shipped/unshipped}" 2>&1 |
        tee -a "$OUT/bench_cold_baseline_$step.log" | grep -A12 "cold s"
    fi
    ;;
  test)
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernel_cache_gpu.py 2>&1 | tail -15
    ;;
  *) echo "first_run_on_gpu.sh: subject, build, bench, ballstick or test" >&2; exit 2 ;;
esac
