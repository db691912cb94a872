#!/usr/bin/env bash
# Tests the sdist as a machine with a compiler but without the C libraries' -dev packages
# builds it (`make test-sdist`): builds the sdist, installs it into a fresh virtual
# environment with the system's zstd, xxHash, lz4, libspng and TurboJPEG hidden from CMake
# (every find_* ignores /usr and /usr/local), checks that the extension then loads none of
# them from the system (FASTLOAD_THIRD_PARTY_FROM_SOURCE=AUTO built them from the pinned
# source archives), and writes and reads a dataset with every codec through it. The source
# archives come from the build cache's downloads when there (scripts/build_wheel.sh; each is
# checked against its sha256 before use); the libraries themselves are built every time, as
# that build is what this tests.
#
#   TORCH_SPEC   the torch to install (default torch==2.13.0, as the Makefile)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/build_stages.sh
. scripts/build_stages.sh
ROOT=$PWD
PY_BOOT=${PYTHON_BOOT:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TOOLS=$ROOT/build/wheel-tools
VENV=$ROOT/build/sdist-test-venv
OUT=$ROOT/build/sdist
if [ "$BUILD_CACHE" = off ]; then
  DOWNLOADS=$ROOT/build/third-party-downloads
else
  DOWNLOADS=$BUILD_CACHE/downloads
fi

stage "the sdist"
[ -x "$TOOLS/bin/python" ] || "$PY_BOOT" -m venv "$TOOLS"
"$TOOLS/bin/python" -m pip install -q "build==1.6.1"
rm -rf "$OUT"
# Built from a copy of the files git sees (tracked, and new ones not ignored), not from the checkout:
# scikit-build-core walks every directory it finds, and follows links, even in ignored ones, so
# build/wineprefix (make test-windows-core; its drive z: is a link to /) kept it walking / for ever.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git ls-files -z --cached --others --exclude-standard \
  | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$src"
"$TOOLS/bin/python" -m build --sdist -o "$OUT" "$src" >/dev/null
sdists=("$OUT"/fastload-*.tar.gz)
stage_done "${sdists[0]}, $(du -k "${sdists[0]}" | cut -f1) KiB"

stage "a fresh venv with $TORCH_SPEC and the sdist built in it (the C libraries from source: minutes)"
rm -rf "$VENV" build/sdist-build
"$PY_BOOT" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
printf '%s\n' "$TORCH_SPEC" > "$VENV/torch-constraint.txt"
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -c "$VENV/torch-constraint.txt" \
  -C build-dir="$ROOT/build/sdist-build" \
  -C cmake.define.CMAKE_IGNORE_PREFIX_PATH="/usr;/usr/local" \
  -C cmake.define.CMAKE_SYSTEM_IGNORE_PREFIX_PATH="/usr;/usr/local" \
  -C cmake.define.FASTLOAD_THIRD_PARTY_DOWNLOADS="$DOWNLOADS" \
  "${sdists[0]}"
stage_done

work=$(mktemp -d)
trap 'rm -rf "$work" "$src"' EXIT
cd "$work"
native=$("$VENV/bin/python" -c 'import fastload._native as n; print(n.__file__)')
stage "ldd $native: no codec library from the system"
deps=$(LD_LIBRARY_PATH= ldd "$native")
echo "$deps"
if echo "$deps" | grep -E 'lib(zstd|xxhash|lz4|spng|turbojpeg)'; then
  echo "test_sdist: the extension links a codec library from the system: the fallback did not build them" >&2
  exit 1
fi
stage_done
stage "every codec written and read back through the extension"
"$VENV/bin/python" - <<'PY'
import numpy as np
import fastload

rng = np.random.default_rng(0)
images = (np.indices((32, 32)).sum(0)[None, None] + rng.integers(0, 9, (40, 3, 32, 32))).astype(np.uint8)
labels = np.arange(40, dtype=np.int64)
for codec in ("raw", "zstd", "zstd-shuffle", "lz4", "lz4-shuffle", "png", "jpeg"):
    out = f"ds-{codec}"
    image_options = {"layout": "chw"} if codec in ("png", "jpeg") else {}
    fastload.write_arrays(out, {"image": images, "label": labels}, codec={"image": codec},
                          samples_per_shard=16, **image_options)
    batch = next(iter(fastload.ShardLoader(out, batch_size=40, backend="native")))
    got = batch["image"].numpy()
    assert batch["label"].tolist() == labels.tolist(), codec
    if codec == "jpeg":
        assert np.abs(got.astype(int) - images).mean() < 8, codec
    else:
        assert np.array_equal(got, images), codec
    same = next(iter(fastload.ShardLoader(out, batch_size=40, backend="torch", num_workers=0)))["image"].numpy()
    assert np.array_equal(same, got), codec
print("test_sdist: every codec writes and reads back through the extension built from the sdist")
PY
stage_done
