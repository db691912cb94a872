#!/usr/bin/env bash
# Tests the wheel `make wheel` built (`make test-wheel`): a fresh virtual environment holding
# only the wheel, torch (pinned) and the test dependencies; a check that the extension resolves
# nothing but the C runtime from the system (ldd, LD_LIBRARY_PATH empty); then the test suite
# against the installed package, from a copy of tests/ outside the checkout.
#
#   TORCH_SPEC         the torch to install (default torch==2.13.0, as the Makefile)
#   FASTLOAD_PYTEST          pytest arguments (default: the whole suite, "tests -q")
#   FASTLOAD_PYTEST_MARKERS  a marker expression to select with (-m), e.g. "not slow"; empty: none
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/build_stages.sh
. scripts/build_stages.sh
ROOT=$PWD
PY_BOOT=${PYTHON_BOOT:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VENV=$ROOT/build/wheel-test-venv
tag=$("$PY_BOOT" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
shopt -s nullglob
wheels=(wheelhouse/fastload-*-"$tag"-"$tag"-manylinux_*.whl)
if [ ${#wheels[@]} -ne 1 ]; then
  echo "test_wheel: expected one $tag manylinux wheel in wheelhouse/ (run make wheel), found ${#wheels[@]}" >&2
  exit 1
fi
wheel=$ROOT/${wheels[0]}

stage "a fresh venv with $TORCH_SPEC and $(basename "$wheel")[dev]"
rm -rf "$VENV"
"$PY_BOOT" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
printf '%s\n' "$TORCH_SPEC" > "$VENV/torch-constraint.txt"
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -c "$VENV/torch-constraint.txt" "$wheel[dev]"
stage_done

# Outside the checkout, with nothing of it on the path.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
unset PYTHONPATH
native=$("$VENV/bin/python" -c 'import fastload._native as n; print(n.__file__)')
case "$native" in
  "$VENV"/*) ;;
  *) echo "test_wheel: fastload._native came from $native, not the test venv" >&2; exit 1 ;;
esac
stage "ldd $native: only the C runtime from the system"
deps=$(LD_LIBRARY_PATH= ldd "$native")
echo "$deps"
# Only the C runtime and the unwinder (libgcc_s) of the manylinux policy may come from the system.
bad=$(echo "$deps" | grep -v -E '^\s*(linux-vdso\.so|/lib64/ld-linux|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libgcc_s\.so)' || true)
if [ -n "$bad" ]; then
  echo "test_wheel: the extension loads libraries outside the manylinux policy:" >&2
  echo "$bad" >&2
  exit 1
fi
stage_done

# The tests, and the files some of them read from the checkout (README.md, docs/, csrc/bindings/, python/ for the
# layer lint), copied; a plugin asserts the session imports the installed fastload.
cp -r "$ROOT/tests" "$ROOT/README.md" "$ROOT/pyproject.toml" "$ROOT/docs" "$work/"
mkdir -p "$work/csrc" && cp -r "$ROOT/csrc/bindings" "$work/csrc/"  # a source check of the exit gate reads them
cp -r "$ROOT/python" "$work/python"
mkdir "$work/plugin"
cat > "$work/plugin/installed_fastload.py" <<EOF
import fastload


def pytest_sessionstart(session):
    assert fastload.__file__.startswith("$VENV/"), fastload.__file__
EOF
# shellcheck disable=SC2206
args=(${FASTLOAD_PYTEST:-tests -q})
if [ -n "${FASTLOAD_PYTEST_MARKERS:-}" ]; then args+=(-m "$FASTLOAD_PYTEST_MARKERS"); fi
stage "the tests against the installed wheel: ${args[*]}"
PYTHONPATH="$work/plugin" "$VENV/bin/pytest" -p installed_fastload -p no:cacheprovider --rootdir "$work" "${args[@]}"
stage_done
