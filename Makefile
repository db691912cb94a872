# fastload: set-up, demo, tests and benchmarks. Every target installs what it
# needs and is idempotent: run `make demo` or `make test` on a fresh machine.

PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
TORCH_SPEC  ?= torch==2.13.0
APT_PACKAGES := libzstd-dev libxxhash-dev liblz4-dev libspng-dev libturbojpeg0-dev pkg-config
SOURCES     := $(shell find csrc python -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.py' -o -name '*.pyi' -o -name 'py.typed' \)) CMakeLists.txt $(wildcard cmake/*.cmake) pyproject.toml
ASAN_SITE   := build/asan-site
ASAN_PRELOAD = $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libubsan.so) $(shell gcc -print-file-name=libstdc++.so)
ASAN_ENV     = PYTHONPATH=$(ASAN_SITE) LD_PRELOAD="$(ASAN_PRELOAD)" \
               ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

# The tests that drive the native core (reading, decoding, transforms, hostile shards and parameters,
# threads and process lifecycle; remote_window.py last: its download threads idle out after the
# lifecycle suites' thread counts are taken): the sanitizer build runs them (ASAN_TESTS=tests: the whole suite),
# and the wheel's run adds none of the CLI, conversion or trainer tests the source build already ran.
NATIVE_TESTS := $(addprefix tests/test_,augment.py binding.py blocks.py codecs.py corruption.py damage.py \
    dataset.py device.py epochs.py exit_live_iterators.py format.py format_v2.py hostile_params.py \
    lifecycle.py lifecycle_hostile.py limits.py loader.py manifest_bounds.py native_stub.py order.py \
    planned_batches.py png_profile.py sampling.py shard_files.py state.py transforms.py transforms_masks.py \
    truncation.py verify.py remote_window.py warm_up.py)
ASAN_TESTS   ?= $(NATIVE_TESTS)
# The wheel's own risks are its static C libraries and its toolchain: the codecs, the record and shard
# readers, the transforms, the reader's threads and the SIGBUS guard. Its Python is the source tree's,
# which `make test` already ran (FASTLOAD_PYTEST="tests -q" runs everything against the wheel).
WHEEL_TESTS  := $(addprefix tests/test_,augment.py binding.py blocks.py codecs.py corruption.py format.py format_v2.py \
    hostile_params.py loader.py native_stub.py png_profile.py transforms.py truncation.py verify.py)

FUZZ_PACKAGES := clang libclang-rt-dev
SHARD_TEST_DIR := build/cross-test-shards

# The Windows cross-build: mingw-w64 (posix threads) and Wine (64-bit), with a
# project-local, headless Wine prefix. zstd, xxHash, lz4, libspng and
# libjpeg-turbo come from pinned, hash-checked source archives
# (cmake/third_party_windows.cmake); zlib for libspng is Debian's mingw-w64 build.
WINDOWS_PACKAGES := g++-mingw-w64-x86-64-posix wine64 wine libz-mingw-w64-dev
WINDOWS_BUILD    := build/windows-core
WINE_ENV         := WINEPREFIX=$(abspath build/wineprefix) WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" DISPLAY=
FUZZ_BUILD   := build/fuzz
FUZZ_CORPUS  := build/fuzz-corpus
FUZZ_SECONDS ?= 600

# (wheel and test-wheel: self-contained manylinux wheels, scripts/build_wheel.sh and scripts/test_wheel.sh)
.PHONY: docs wheel test-wheel test-sdist install system-deps demo test test-quick test-gpu test-asan test-cpp test-windows-core bench bench-quick lint clean fuzz fuzz-ci fuzz-build

install: $(VENV)/.installed

# System libraries the native extension links against (Debian/Ubuntu only;
# elsewhere CMake names the packages to install when they are missing).
system-deps:
	@scripts/install_system_deps.sh $(APT_PACKAGES)

$(VENV)/.venv-ok:
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	touch $@

# torch first, pinned, and only when missing: an unpinned torch pulls CUDA wheels.
$(VENV)/.torch-ok: $(VENV)/.venv-ok
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	touch $@

# The dev extras include packages that depend on torch (lightning): a constraints file
# keeps the pinned torch, so pip never swaps it for another build.
$(VENV)/.installed: $(VENV)/.torch-ok $(SOURCES) | system-deps
	printf '%s\n' "$(TORCH_SPEC)" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12" "cmake>=3.18" ninja
	$(PY) -m pip install -q --no-build-isolation -c $(VENV)/torch-constraint.txt ".[dev]"
	touch $@

# A self-contained manylinux_2_28 wheel into wheelhouse/: the C libraries from pinned sources,
# linked statically, built with zig's toolchain for glibc 2.28 (needs no -dev packages).
# FASTLOAD_WHEEL_PYTHONS="python3.10 python3.11 ..." builds one wheel per interpreter. The C libraries
# and build tools are built once into ~/.cache/fastload-build (FASTLOAD_BUILD_CACHE; README "Install"
# has the minutes: about 16 the first time, 2 in a fresh clone after).
wheel:
	PYTHON_BOOT=$(PYTHON_BOOT) scripts/build_wheel.sh

# The wheel in a fresh venv (only it, torch and the test dependencies): ldd shows no codec
# library from the system, and the suite runs against it from outside the checkout.
# The trainer tests (marker `slow`: Lightning, torchrun, each minutes of subprocesses that exercise no
# more of the binary) run in `make test` only, to keep CI's time; FASTLOAD_PYTEST_MARKERS= runs all.
test-wheel: wheel
	PYTHON_BOOT=$(PYTHON_BOOT) TORCH_SPEC="$(TORCH_SPEC)" FASTLOAD_PYTEST_MARKERS="$${FASTLOAD_PYTEST_MARKERS-not slow}" \
	    FASTLOAD_PYTEST="$${FASTLOAD_PYTEST-$(WHEEL_TESTS) -q}" scripts/test_wheel.sh

# The sdist built on a machine with a compiler but without the C libraries' -dev packages
# (hidden from CMake): the extension links none from the system, and every codec round-trips.
test-sdist:
	PYTHON_BOOT=$(PYTHON_BOOT) TORCH_SPEC="$(TORCH_SPEC)" scripts/test_sdist.sh

demo: install
	$(PY) -m fastload.demo --output-dir demo-output

# The Python suite in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them, in
# the suite's order (--dist loadfile: a file's module fixtures, its server, cluster or dataset, are built
# once; thread, fd and RSS counts are per process). Many tests wait on subprocesses, servers and retry
# delays, so 2 processes overlap them on 2 cores. TEST_WORKERS=0 runs it in this process, one test at a time.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: install test-cpp
	$(PY) -m pytest tests $(PYTEST_PARALLEL)

# The quick tier for the edit-test loop (docs/testing.md): every test not marked `slow` (no S3 server,
# Dask cluster or Python subprocess campaign), 156 s here; no C++ tests. `make test` runs all. In one
# process: its tests keep the CPU busy rather than wait, and 2 processes took as long (156 s against 159 s).
test-quick: install
	$(PY) -m pytest tests -m "not slow"

# The tests that need a GPU (marker `cuda`); without CUDA they are reported as skipped.
test-gpu: install
	$(PY) -m pytest tests -m cuda -ra

# The C++ core's own tests, and the Python suite against an ASan+UBSan build.
test-cpp: install
	$(PY) scripts/cross_test_shards.py $(SHARD_TEST_DIR)
	$(VENV)/bin/cmake -S . -B build/cpp-tests -DFASTLOAD_BUILD_TESTS=ON -DFASTLOAD_BUILD_PYTHON=OFF \
	    -DFASTLOAD_SANITIZE=ON -DFASTLOAD_SHARD_TEST_DIR=$(abspath $(SHARD_TEST_DIR)) >/dev/null
	$(VENV)/bin/cmake --build build/cpp-tests -j2 >/dev/null
	cd build/cpp-tests && $(abspath $(VENV))/bin/ctest --output-on-failure

# The C++ core and its tests as Windows .exe files (mingw-w64), run under Wine on
# shards this Linux build writes (the format is the same file on both).
test-windows-core: install
	@scripts/install_system_deps.sh $(WINDOWS_PACKAGES)
	$(PY) scripts/cross_test_shards.py $(SHARD_TEST_DIR)
	$(VENV)/bin/cmake -S . -B $(WINDOWS_BUILD) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	    -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake -DFASTLOAD_BUILD_PYTHON=OFF -DFASTLOAD_BUILD_TESTS=ON \
	    -DFASTLOAD_THIRD_PARTY_FROM_SOURCE=ON -DFASTLOAD_DOWNLOAD_PYTHON=$(abspath $(PY)) >/dev/null
	$(VENV)/bin/cmake --build $(WINDOWS_BUILD) -j2 >/dev/null
	$(WINE_ENV) wine $(WINDOWS_BUILD)/core_tests.exe
	$(WINE_ENV) wine $(WINDOWS_BUILD)/transform_tests.exe
	$(WINE_ENV) wine $(WINDOWS_BUILD)/shard_tests.exe "$$($(WINE_ENV) winepath -w $(SHARD_TEST_DIR))"
	$(WINE_ENV) wine $(WINDOWS_BUILD)/lmdb_readonly_tests.exe "$$($(WINE_ENV) winepath -w $(SHARD_TEST_DIR))"
	$(WINE_ENV) wineserver -w

# In TEST_WORKERS processes as well, each file whole in one of them in the list's order (remote_window.py
# still after the lifecycle suites wherever both run): 553 s on a clean clone (113 the ASan build), 754 serially.
test-asan: install
	$(PY) -m pip install -q --no-build-isolation --no-deps --upgrade --target $(ASAN_SITE) \
	    -C build-dir=build/asan -C cmake.define.FASTLOAD_SANITIZE=ON -C cmake.build-type=Debug .
	$(ASAN_ENV) $(PY) -c "import fastload._native as n; assert '$(ASAN_SITE)' in n.__file__, n.__file__"
	$(ASAN_ENV) $(PY) -m pytest $(ASAN_TESTS) -m "not no_asan" -p no:cacheprovider $(PYTEST_PARALLEL)

bench: install
	$(PY) -m pytest benchmarks --benchmark-only --benchmark-json=benchmarks/results/latest.json
	$(PY) benchmarks/report.py benchmarks/results/latest.json

bench-quick: install
	FASTLOAD_BENCH_QUICK=1 $(PY) -m pytest benchmarks --benchmark-only

# The shard fuzzer (csrc/tests/fuzz_shard.cpp): clang with libFuzzer, ASan and UBSan. Seeds are
# real shards written by scripts/fuzz_corpus.py; new inputs libFuzzer finds go to build/fuzz-found.
fuzz-build: install
	@scripts/install_system_deps.sh $(FUZZ_PACKAGES)
	CXX=clang++ $(VENV)/bin/cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	    -DFASTLOAD_BUILD_PYTHON=OFF -DFASTLOAD_BUILD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	$(VENV)/bin/cmake --build $(FUZZ_BUILD) --target fuzz_shard >/dev/null
	$(PY) scripts/fuzz_corpus.py $(FUZZ_CORPUS)

fuzz: fuzz-build
	mkdir -p build/fuzz-found
	$(FUZZ_BUILD)/fuzz_shard build/fuzz-found $(FUZZ_CORPUS) -max_len=131072 -timeout=10 -rss_limit_mb=2048 \
	    -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1

fuzz-ci:
	$(MAKE) fuzz FUZZ_SECONDS=60

# lint-imports checks the source tree (PYTHONPATH), not the installed copy, against the
# layer contract in pyproject.toml ([tool.importlinter]).
lint: install
	$(PY) -m ruff check python tests benchmarks
	$(PY) -m mypy python/fastload
	PYTHONPATH=python $(VENV)/bin/lint-imports --no-cache

# The documentation site (mkdocs.yml): docs/*.md and the API reference from the docstrings,
# built into site/ with every warning an error (broken links and anchors included).
DOCS_PACKAGES := "mkdocs==1.6.1" "mkdocs-material==9.8.1" "mkdocstrings==1.0.8" "mkdocstrings-python==2.0.11"
docs: install
	$(PY) -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || \
	    $(PY) -m pip install -q -c $(VENV)/torch-constraint.txt $(DOCS_PACKAGES)
	$(PY) -m mkdocs build --strict --clean

clean:
	rm -rf build demo-output site $(VENV)
