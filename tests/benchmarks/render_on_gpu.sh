#!/usr/bin/env bash
# The window at whole-brain scale on the GPU machine's OpenGL (issue 41): bench_render.py under
# Xvfb with the NVIDIA GLX vendor library (hardware OpenGL), 1 M and 10 M streamlines of 100 points.
#
# The parts (Qt, VTK, pyvista wheels, the Debian GL/X stack, the source tree as build/ggsrc) are
# prepared and carried exactly as gui_on_gpu.sh's header says (build/gg1 .. build/gg4, one call
# each while the machine stays warm); the last call runs this script from build/ggsrc:
#
#   cp -r build/gg4/. /tmp/gg/in/ && cd build/ggsrc && bash tests/benchmarks/render_on_gpu.sh
#
# It installs the parts (gui_env_on_gpu.sh, once per machine), writes the synthetic .trx files
# into /tmp/tractlens-bench (1.2 GB and 12 GB; written once per machine, in parallel to nothing
# else) and runs the benchmark: one process per size, the results in $OUT/render_nvidia.json
# (or render_llvmpipe.json when NVIDIA GLX failed), the log in $OUT/render.log. COUNTS overrides
# the sizes ("1000000" alone for a quick look), FRAMES the frames per rotation, DEVICE the
# selection engine's device (auto: CuPy on the GPU). Expected device time: ~1 min to install,
# ~1.5 min to write the files, ~3 min for the two sizes (BENCH_SESSION_SAVE=1 adds a session
# save per size: minutes at 10 M).
set -u
source "$(dirname "$0")/gui_env_on_gpu.sh"
export TRACTLENS_BENCH_CACHE=/tmp/tractlens-bench
export BENCH_SESSION_SAVE=${BENCH_SESSION_SAVE:-0}  # a session save of 10 M streamlines writes 24 GB: off here
free -g | head -2 | tee -a "$log"
df -h /tmp | tail -1 | tee -a "$log"
python3 tests/benchmarks/bench_render.py --counts ${COUNTS:-1000000 10000000} --frames "${FRAMES:-20}" \
  --device "${DEVICE:-auto}" --out "$OUT/render_$(grep -q NVIDIA "$OUT/glxinfo.txt" && echo nvidia || echo llvmpipe).json" \
  2>&1 | tee "$OUT/render.log" | grep -v "^RESULT" | tail -40
