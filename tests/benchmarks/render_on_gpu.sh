#!/usr/bin/env bash
# The window at whole-brain scale on the GPU machine's OpenGL (issue 41): bench_render.py under
# Xvfb with the NVIDIA GLX vendor library (hardware OpenGL), 1 M and 10 M streamlines of 100 points.
#
# The parts (Qt, VTK, pyvista wheels, the Debian GL/X stack) travel as one plain tar split into
# build/gg1, build/gg2, ... (bundle.tar.part-aa, -ab, ..., 46 MB each: five or six, 212 MB in all
# on 2026-11-29; how they are made: gui_on_gpu.sh's header). One call per folder, back to back
# while the machine stays warm, each carrying its folder:
#
#   mkdir -p /tmp/gg/parts && cp build/ggN/* /tmp/gg/parts/                      (N = 1, 2, ...)
#
# then one call that joins and installs them (about 3 minutes; nothing is measured):
#
#   SETUP_ONLY=1 bash tests/benchmarks/render_on_gpu.sh
#
# and one call for the benchmark (its own 10 minutes), carrying the PyOpenGL wheel (.whl/pyopengl-*.whl,
# the gui extra: without it the window draws tractograms with VTK, as FIBRES=vtk does on purpose):
#
#   COUNTS="1000000 10000000" bash tests/benchmarks/render_on_gpu.sh
#   COUNTS=1000000 FIBRES=vtk bash tests/benchmarks/render_on_gpu.sh     (VTK's mapper, for comparison)
#   BENCH_PROFILE=$OUT/profiles COUNTS=10000000 bash tests/benchmarks/render_on_gpu.sh   (the GUI thread's profile of
#                                    the colour changes, ROI edits and glyph steps, as text files)
#
# It writes the synthetic .trx files into /tmp/tractlens-bench (1.2 GB and 12 GB, once per
# machine) and runs the benchmark, one process per size, within BENCH_BUDGET_S seconds (default
# 540: a size still running then is stopped and its row says so; the results are written after
# each size). Results: $OUT/render_h100.json (the GPU model from the OpenGL renderer string;
# render_llvmpipe.json when NVIDIA GLX failed), the log in $OUT/render.log. COUNTS overrides the
# sizes ("1000000" alone for a quick look), FRAMES the frames per rotation, DEVICE the selection
# engine's device (auto: CuPy on the GPU). BENCH_SESSION_SAVE=1 adds a session save per size.
# Before the benchmark, tests/benchmarks/gl_probe.py writes $OUT/gl_probe.json (the context and the
# fibre program chosen, with why); GL_TESTS=1 adds tests/gui/test_fiber_gl.py ($OUT/test_fiber_gl.log);
# PROBE_ONLY=1 stops after those.
set -u
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
if [ ! -e /tmp/gg/installed ] && ls /tmp/gg/parts/bundle.tar.part-* >/dev/null 2>&1; then
  mkdir -p /tmp/gg/in
  cat /tmp/gg/parts/bundle.tar.part-* | tar -xf - -C /tmp/gg/in || { echo "the carried parts do not join"; exit 1; }
fi
source "$(dirname "$0")/gui_env_on_gpu.sh"
[ "${SETUP_ONLY:-0}" = 1 ] && { echo "set up; run again without SETUP_ONLY for the benchmark"; exit 0; }
export TRACTLENS_BENCH_CACHE=/tmp/tractlens-bench
export BENCH_SESSION_SAVE=${BENCH_SESSION_SAVE:-0}  # a session save of 10 M streamlines writes 24 GB: off here
export BENCH_BUDGET_S=${BENCH_BUDGET_S:-540}
free -g | head -2 | tee -a "$log"
df -h /tmp | tail -1 | tee -a "$log"
nproc | tee -a "$log"
# What the window's OpenGL context is and which fibre program it gets, and why (a few seconds);
# GL_TESTS=1 also runs the fibre layer's GUI tests on this OpenGL (-s prints the program's reason).
python3 tests/benchmarks/gl_probe.py --out "$OUT/gl_probe.json" 2>"$OUT/gl_probe.log" |
  grep -E '"(renderer|version_string|queried_version|profile|max_texture_buffer_texels|draw_ids|fibre_program|fibre_program_why|pulled_refusal|fibre_gl_failed)"' | tee -a "$log"
if [ "${GL_TESTS:-0}" = 1 ]; then
  python3 -m pytest tests/gui/test_fiber_gl.py -q -s -p no:cacheprovider 2>&1 | tee "$OUT/test_fiber_gl.log" |
    grep -E "fibre program|passed|failed|Error" | tail -12
fi
[ "${PROBE_ONLY:-0}" = 1 ] && exit 0
python3 tests/benchmarks/bench_render.py --counts ${COUNTS:-1000000 10000000} --frames "${FRAMES:-20}" \
  --device "${DEVICE:-auto}" --fibres "${FIBRES:-own}" --out-dir "$OUT" 2>&1 | tee "$OUT/render.log" \
  | grep -v "^RESULT" | tail -40
