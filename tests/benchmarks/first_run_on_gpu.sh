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
#   bash tests/benchmarks/first_run_on_gpu.sh test       # tests/test_kernel_cache_gpu.py (~4 min)
#   bash tests/benchmarks/first_run_on_gpu.sh quick      # all in one call (~5 min on a fresh machine): see below
#                                                        # (TESTS=0: without the GPU tests, ~3 min)
#
# quick: a fresh HOME, CUPY_CACHE_DIR and TRACTLENS_CACHE (empty temporary folders: nothing a
# user-level cache of this machine holds is used), then at once (16 cores; both compile) the GPU
# tests that need no shipped build (the rehearsal on the demo, then fit-dti and deterministic
# tracking on another subject compile nothing; one reduction kernel whatever the size; the
# engine's nonzero (gpu/indices.py) compiles nothing more for other sizes and shapes; CuPy's own
# compiler finds relocated keys) and a shipped build (packaging/build_kernels.py, small subjects
# only, ~2 min); then the tests of that build; then bench_e2e.py --small --cold (a 48x56x48,
# 65-volume subject no kernel was built on): each command cold (an emptied kernel cache plus the
# shipped build) and warm. Writes $OUT/first_run_<gpu>.json (per command: its command line, cold
# and warm seconds, their ratio, the kernels the cold run compiled, by name), the bench's
# e2e_<gpu>_small.json/.md, the tests' and the build's logs. The HCP-sized numbers of the issue
# need build + bench (their subject alone takes ~1.5 min to make, the build on it ~5 min).
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
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernel_cache_gpu.py tests/test_indices_gpu.py 2>&1 | tail -15
    ;;
  quick)
    start=$(date +%s)
    Q=$(mktemp -d /tmp/tractlens-first-run.XXXXXX)
    before=$(find "$HOME/.cupy/kernel_cache" -type f 2>/dev/null | wc -l)
    export HOME=$Q/home CUPY_CACHE_DIR=$Q/cupy TRACTLENS_CACHE=$Q/tractlens
    mkdir -p "$HOME" "$CUPY_CACHE_DIR" "$TRACTLENS_CACHE"
    echo "fresh caches: HOME=$HOME, CUPY_CACHE_DIR=$CUPY_CACHE_DIR ($(find "$CUPY_CACHE_DIR" -type f | wc -l) files)," \
      "TRACTLENS_CACHE=$TRACTLENS_CACHE; the machine's own ~/.cupy/kernel_cache held $before files (not used)" | tee -a "$OUT/gpu.txt"
    tag=$(python3 -c "import sys; sys.path.insert(0, 'tests/benchmarks'); import bench_e2e; print(bench_e2e.gpu_tag())")
    tests=(python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_kernel_cache_gpu.py tests/test_indices_gpu.py)
    [ "${TESTS:-1}" = 1 ] || tests=(true)  # TESTS=0: the build and the bench only (~3 min)
    # 1. the tests that need no shipped build, beside the build (both mostly wait for NVRTC)
    timeout 420 "${tests[@]}" --basetemp "$Q/pytest-rehearsal" -k "rehearsal or one_reduction or cupys_own_compiler or other_sizes_and_shapes or equal_numpys" \
      >"$OUT/test_rehearsal.log" 2>&1 &
    rehearsal=$!
    B=$Q/build
    mkdir -p "$B"
    timeout 300 python3 packaging/build_kernels.py --out "$B/shipped" --work "$B/work" --measurements 32,96 \
      --commands fit-dti,fit-ballstick,track-prob,track-prob-wb,track-det,track-det-roi,commit,fit-csd,fit-csd-msmt,track-fod \
      >"$B/build.log" 2>&1
    echo "build_kernels: exit $?, $(($(date +%s) - start)) s" | tee -a "$B/build.log"
    cp "$B/build.log" "$OUT/build_kernels_quick.log"
    grep -E ": (ok|FAILED)|kernels, " "$B/build.log" | cut -c1-160
    # 2. the tests of that build
    TRACTLENS_TEST_KERNEL_BUILD=$B timeout 300 "${tests[@]}" --basetemp "$Q/pytest-shipped" \
      -k "shipped_build or without_the_shipped" >"$OUT/test_shipped.log" 2>&1
    tail -4 "$OUT/test_shipped.log"
    wait "$rehearsal"
    tail -6 "$OUT/test_rehearsal.log"
    echo "tests done: $(($(date +%s) - start)) s"
    # 3. cold against warm, nothing else running; bedpostX's data cache (TractLens's, not the
    # compiler's) is built first so the cold runs measure the kernels
    E=$Q/e2e
    python3 tests/benchmarks/bench_e2e.py --small --outdir "$E" --make-only 2>&1 | tail -1
    python3 -m tractlens.app.cli track probabilistic --samples "$E/bedpostx" --seed "$E/seed.nii.gz" \
      --nsamples 1 -o "$Q/prime" --device cpu --quiet 2>&1 | tail -2
    TRACTLENS_SHIPPED_KERNELS_DIR=$B/shipped timeout 400 python3 tests/benchmarks/bench_e2e.py --small --outdir "$E" \
      --device gpu --cold --cold-pairs "${COLD_PAIRS:-3}" --kernel-cache "$Q/cold-cupy" --results "$OUT" --tag "${tag}_small" \
      --first-run-summary "$OUT/first_run_$tag.json" >"$OUT/bench_cold_small.log" 2>&1
    grep -A9 "cold s" "$OUT/bench_cold_small.log"
    python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print('target met:', s['met']); \
[print(k, v['cold_over_warm'], v['kernels_compiled_cold_names'], \
  {side: (w.get('startup_s'), w.get('gpu_warmup_s')) for side, w in v.get('cold_vs_warm', {}).items()}) \
 for k, v in s['commands'].items()]" \
      "$OUT/first_run_$tag.json"
    echo "quick: $(($(date +%s) - start)) s"
    ;;
  *) echo "first_run_on_gpu.sh: subject, build, bench, ballstick, test or quick" >&2; exit 2 ;;
esac
