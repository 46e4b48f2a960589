#!/usr/bin/env bash
# Build the self-contained Linux bundle: one folder holding Python, TractLens and every library it
# needs (Qt, VTK, NumPy, SciPy, nibabel, ...), started as `<folder>/tractlens` on a machine without
# Python. Built from the wheel, with PyInstaller, in a throw-away virtual environment.
#
#   packaging/build_bundle.sh [--out DIR] [--extras gpu,fast-io] [--python PY] [--archive]
#
#   --out DIR       where the bundle folder goes (default dist/tractlens-<version>-linux-x86_64);
#                   its program is DIR/tractlens
#   --extras LIST   extras installed beside the wheel and carried in the bundle, e.g. `gpu` for a
#                   CUDA build (CuPy; packaging/README.md), `fast-io`, `anatomy`
#   --python PY     the interpreter the bundle is made from (default python3; it must have a shared
#                   libpython, as distribution and pyenv --enable-shared builds do). The bundle runs
#                   on Linux systems with a glibc at least as new as the build machine's.
#   --archive       also write DIR.tar.gz
#
# Needs network access to PyPI (or PIP_INDEX_URL / PIP_FIND_LINKS pointing to the wheels). Takes several minutes (measured by tests/test_bundle.py; see
# packaging/README.md). Work files go to a temporary folder that is removed at the end
# (TRACTLENS_BUNDLE_KEEP=1 keeps it and prints where).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="" extras="" python=python3 archive=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --extras) extras=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --archive) archive=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -1)
out=${out:-$root/dist/tractlens-$version-linux-x86_64}
out=$(mkdir -p "$(dirname "$out")" && cd "$(dirname "$out")" && pwd)/$(basename "$out")
work=$(mktemp -d "${TMPDIR:-/tmp}/tractlens-bundle.XXXXXX")
if [ "${TRACTLENS_BUNDLE_KEEP:-0}" = 1 ]; then echo "work folder: $work"; else trap 'rm -rf "$work"' EXIT; fi
step() { echo "[$(date +%H:%M:%S)] $*"; }

step "virtual environment"
"$python" -m venv "$work/venv"
vpy="$work/venv/bin/python"
"$vpy" -m pip install --quiet --disable-pip-version-check "setuptools>=70.1" "pyinstaller>=6.10"
step "wheel"
"$vpy" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w "$work/wheel" "$root"
wheel=$(ls "$work"/wheel/tractlens-*.whl)
spec="$wheel"
[ -n "$extras" ] && spec="tractlens[$extras] @ file://$wheel"
"$vpy" -m pip install --quiet --disable-pip-version-check "$spec"
step "PyInstaller"
# run from the work folder: the analysis imports the installed wheel, never the source tree
(cd "$work" && "$work/venv/bin/pyinstaller" --noconfirm --log-level WARN \
  --distpath "$work/dist" --workpath "$work/build" "$root/packaging/tractlens.spec")
rm -rf "$out"
mv "$work/dist/tractlens" "$out"
cp "$root/LICENSE" "$out/LICENSE.txt"
"$vpy" -m pip freeze --exclude-editable >"$out/PACKAGES.txt"
if [ "$archive" = 1 ]; then
  step "archive"
  tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
fi
step "done: $out/tractlens ($(du -sh "$out" | cut -f1))"
