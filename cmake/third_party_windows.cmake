# The C libraries of the core built from source, for targets where no system
# package is at hand (the mingw-w64 cross-build of `make test-windows-core`).
# Sources come from source distributions on PyPI that bundle them, at pinned
# versions whose sha256 is checked here before anything is extracted; they
# are fetched with pip (the only client needed) at configure time into
# FASTLOAD_THIRD_PARTY_DOWNLOADS, never at import time. Defines the same
# interface target as dependencies.cmake: fastload_deps.
#
# To add a library: one fastload_third_party_source() call (name, version,
# sha256, the bundled files to extract) and one add_library over its files.
#
#   lib            PyPI sdist         bundled as
#   zstd           zstandard 0.23.0   zstd/zstd.c (single-file zstd 1.5.6) + headers
#   xxHash         xxhash 3.5.0       deps/xxhash/xxhash.{c,h} (xxHash 0.8.2)
#   lz4            lz4 4.4.5          lz4libs/lz4.{c,h} (lz4 1.9.4)
#   libspng        pyspng 0.1.4       vendor/libspng-0.7.4/spng/spng.{c,h}
#   libjpeg-turbo  pylibjxl 0.5.0     third_party/libjpeg-turbo (3.1.3, the whole tree,
#                                     built with its own CMake, SIMD off: no nasm needed)
#   LMDB           lmdb 3.0.0         lib/mdb.c, midl.c (LMDB 0.9.36, without py-lmdb's patches)
#   zlib           zlib-ng 1.1.0      src/zlib_ng/zlib-ng (zlib-ng 2.3.3, ZLIB_COMPAT: the zlib
#                                     1.3.1 API; built with its own CMake), not on Windows
# zlib (for libspng) on Windows is the target's own: Debian's libz-mingw-w64-dev for
# the mingw-w64 cross-build (the Makefile installs it), linked statically.
# This file also builds the self-contained Linux wheels (scripts/build_wheel.sh),
# and sdist builds where the system lacks a library (FASTLOAD_THIRD_PARTY_FROM_SOURCE=AUTO).
# The core reads shards without liblmdb: LMDB is built only for
# csrc/tests/lmdb_readonly_tests.cpp, which checks py-lmdb's read-only
# opening of shards on Windows.

enable_language(C)
# The Python building the wheel by default (scikit-build-core names it): its pip.
if(Python_EXECUTABLE)
  set(_download_python "${Python_EXECUTABLE}")
else()
  set(_download_python "python3")
endif()
set(FASTLOAD_DOWNLOAD_PYTHON "${_download_python}" CACHE STRING "A Python with pip, used to download the source archives")
set(FASTLOAD_THIRD_PARTY_DOWNLOADS "${CMAKE_BINARY_DIR}/third-party-downloads" CACHE PATH
    "Where the pinned source archives are downloaded (and reused when their hash matches)")

# Downloads (when missing) and checks PyPI sdist NAME==VERSION, then extracts
# PATTERNS from it; sets <VAR> to the extracted top directory. pip reads an
# sdist's metadata to download it: with BUILD_ISOLATION first, it installs the
# sdist's build requirements for that (lz4's version comes from setuptools_scm).
# `--no-binary NAME`, not `:all:`: only NAME must be the sdist; with `:all:` pip
# also builds the sdist's build requirements from source in that environment
# (CMake itself, with `make -j1`: half an hour in a wheel build).
function(fastload_third_party_source VAR NAME VERSION SHA256)
  set(patterns ${ARGN})
  set(isolation --no-build-isolation)
  if(patterns AND "${ARGV4}" STREQUAL "BUILD_ISOLATION")
    list(REMOVE_AT patterns 0)
    set(isolation "")
  endif()
  set(archive "${FASTLOAD_THIRD_PARTY_DOWNLOADS}/${NAME}-${VERSION}.tar.gz")
  if(EXISTS "${archive}")
    file(SHA256 "${archive}" have)
  endif()
  if(NOT EXISTS "${archive}" OR NOT have STREQUAL SHA256)
    file(REMOVE "${archive}")
    message(STATUS "fastload: downloading the ${NAME} ${VERSION} source distribution from PyPI")
    # (Quiet when a retry follows: a Python without the sdist's build backend fails to read its
    # metadata here with a long traceback, and the retry below is what counts.)
    if(isolation)
      set(_quiet OUTPUT_QUIET ERROR_QUIET)
    else()
      set(_quiet "")
    endif()
    execute_process(
      # (Without the variables of pip's isolated build environment, which hide pip itself.)
      COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
              ${FASTLOAD_DOWNLOAD_PYTHON} -m pip download --quiet --no-deps --no-binary ${NAME}
              ${isolation} -d "${FASTLOAD_THIRD_PARTY_DOWNLOADS}" "${NAME}==${VERSION}"
      RESULT_VARIABLE rc ${_quiet})
    if(NOT rc EQUAL 0 AND isolation)
      # (A Python without setuptools and wheel reads the metadata in an isolated environment.)
      execute_process(
        COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
                ${FASTLOAD_DOWNLOAD_PYTHON} -m pip download --quiet --no-deps --no-binary ${NAME}
                -d "${FASTLOAD_THIRD_PARTY_DOWNLOADS}" "${NAME}==${VERSION}"
        RESULT_VARIABLE rc)
    endif()
    if(NOT rc EQUAL 0 OR NOT EXISTS "${archive}")
      message(FATAL_ERROR "fastload: could not download ${NAME}==${VERSION} (sdist) with pip; put "
                          "${NAME}-${VERSION}.tar.gz into ${FASTLOAD_THIRD_PARTY_DOWNLOADS} by hand.")
    endif()
    file(SHA256 "${archive}" have)
  endif()
  if(NOT have STREQUAL SHA256)
    message(FATAL_ERROR "fastload: ${archive} has sha256 ${have}, expected ${SHA256}: refusing to build it.")
  endif()
  set(dest "${CMAKE_BINARY_DIR}/third-party/${SHA256}")
  if(NOT EXISTS "${dest}/.extracted")
    file(REMOVE_RECURSE "${dest}")
    file(ARCHIVE_EXTRACT INPUT "${archive}" DESTINATION "${dest}" PATTERNS ${patterns})
    file(TOUCH "${dest}/.extracted")
  endif()
  set(${VAR} "${dest}/${NAME}-${VERSION}" PARENT_SCOPE)
endfunction()

fastload_third_party_source(_zstd zstandard 0.23.0
  b2d8c62d08e7255f68f7a740bae85b3c9b8e5466baa9cbf7f57f1cde0ac6bc09
  zstandard-0.23.0/zstd/*)
fastload_third_party_source(_xxhash xxhash 3.5.0
  84f2caddf951c9cbf8dc2e22a89d4ccf5d86391ac6418fe81e3c67d0cf60b45f
  xxhash-3.5.0/deps/xxhash/*)

# Third-party code: built as published, without the project's warnings.
add_library(fastload_zstd STATIC "${_zstd}/zstd/zstd.c")
target_include_directories(fastload_zstd SYSTEM PUBLIC "${_zstd}/zstd")
target_compile_definitions(fastload_zstd PRIVATE ZSTD_DISABLE_ASM ZSTD_LEGACY_SUPPORT=0)

add_library(fastload_xxhash STATIC "${_xxhash}/deps/xxhash/xxhash.c")
target_include_directories(fastload_xxhash SYSTEM PUBLIC "${_xxhash}/deps/xxhash")

fastload_third_party_source(_lmdb lmdb 3.0.0
  06dda0723545e14d56ac7dcd6f582d9922c2ed5e16f1c3f8d0e670a96ec2ee65
  lmdb-3.0.0/lib/*)
add_library(fastload_lmdb STATIC "${_lmdb}/lib/mdb.c" "${_lmdb}/lib/midl.c")
target_include_directories(fastload_lmdb SYSTEM PUBLIC "${_lmdb}/lib")
find_package(Threads REQUIRED)
target_link_libraries(fastload_lmdb PUBLIC Threads::Threads)

fastload_third_party_source(_lz4 lz4 4.4.5
  5f0b9e53c1e82e88c10d7c180069363980136b9d7a8306c4dca4f760d60c39f0
  BUILD_ISOLATION lz4-4.4.5/lz4libs/*)
add_library(fastload_lz4 STATIC "${_lz4}/lz4libs/lz4.c")
target_include_directories(fastload_lz4 SYSTEM PUBLIC "${_lz4}/lz4libs")

# The sub-builds (zlib-ng, libjpeg-turbo) use the same compilers and flags as this one, as
# position-independent code (they are linked into the extension module).
include(ExternalProject)
# The sub-builds' output: into log files, shown only on failure (an extension's build stays short), or
# with FASTLOAD_THIRD_PARTY_LOG_TO_FILES=OFF to the terminal as it comes (cmake/third_party_prefix, which
# scripts/build_wheel.sh runs as a stage of its own: their progress lines instead of minutes of silence).
option(FASTLOAD_THIRD_PARTY_LOG_TO_FILES "Log the zlib-ng and libjpeg-turbo sub-builds to files, not the terminal" ON)
if(FASTLOAD_THIRD_PARTY_LOG_TO_FILES)
  set(_sub_output LOG_CONFIGURE ON LOG_BUILD ON LOG_OUTPUT_ON_FAILURE ON)
else()
  set(_sub_output LOG_CONFIGURE ON LOG_OUTPUT_ON_FAILURE ON USES_TERMINAL_BUILD ON)
endif()
set(_sub_args -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON)
if(CMAKE_TOOLCHAIN_FILE)
  get_filename_component(_toolchain "${CMAKE_TOOLCHAIN_FILE}" ABSOLUTE BASE_DIR "${CMAKE_SOURCE_DIR}")
  list(APPEND _sub_args "-DCMAKE_TOOLCHAIN_FILE=${_toolchain}")
else()
  list(APPEND _sub_args "-DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}" "-DCMAKE_C_FLAGS=${CMAKE_C_FLAGS}")
  if(CMAKE_OSX_ARCHITECTURES)
    list(APPEND _sub_args "-DCMAKE_OSX_ARCHITECTURES=${CMAKE_OSX_ARCHITECTURES}")
  endif()
  if(CMAKE_OSX_DEPLOYMENT_TARGET)
    list(APPEND _sub_args "-DCMAKE_OSX_DEPLOYMENT_TARGET=${CMAKE_OSX_DEPLOYMENT_TARGET}")
  endif()
endif()
if(CMAKE_MAKE_PROGRAM)
  list(APPEND _sub_args "-DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}")
endif()

# libspng inflates with zlib, linked statically: the target's own on Windows, elsewhere
# zlib-ng in its zlib-compatible mode, built from the pinned sources.
if(WIN32)
  find_path(FASTLOAD_ZLIB_INCLUDE_DIR zlib.h)
  find_library(FASTLOAD_ZLIB_LIBRARY NAMES libz.a z zlib)
  if(NOT FASTLOAD_ZLIB_INCLUDE_DIR OR NOT FASTLOAD_ZLIB_LIBRARY)
    message(FATAL_ERROR "fastload: zlib for the target was not found (libspng needs it); for the mingw-w64 "
                        "cross-build: sudo apt-get install libz-mingw-w64-dev")
  endif()
else()
  fastload_third_party_source(_zlibng zlib_ng 1.1.0
    08a3a8468d4f130e3dc80d28ec42fcc7a878a57dfed616233e791066327d78a3
    BUILD_ISOLATION zlib_ng-1.1.0/src/zlib_ng/zlib-ng/*)
  set(_zlib_src "${_zlibng}/src/zlib_ng/zlib-ng")
  set(_zlib_build "${CMAKE_BINARY_DIR}/zlib-ng")
  ExternalProject_Add(fastload_zlib_build
    SOURCE_DIR "${_zlib_src}"
    BINARY_DIR "${_zlib_build}"
    CMAKE_ARGS ${_sub_args} "-DCMAKE_INSTALL_PREFIX=${_zlib_build}/not-installed" -DZLIB_COMPAT=ON
               -DBUILD_TESTING=OFF -DWITH_GTEST=OFF -DWITH_GZFILEOP=OFF -DWITH_NATIVE_INSTRUCTIONS=OFF
    BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> --target zlib-ng
    BUILD_BYPRODUCTS "${_zlib_build}/${CMAKE_STATIC_LIBRARY_PREFIX}z${CMAKE_STATIC_LIBRARY_SUFFIX}"
    UPDATE_COMMAND "" INSTALL_COMMAND ""
    ${_sub_output})
  # (The include directory exists only after the build: created now so the target may name it.)
  file(MAKE_DIRECTORY "${_zlib_build}")
  add_library(fastload_zlib STATIC IMPORTED GLOBAL)
  set_target_properties(fastload_zlib PROPERTIES
    IMPORTED_LOCATION "${_zlib_build}/${CMAKE_STATIC_LIBRARY_PREFIX}z${CMAKE_STATIC_LIBRARY_SUFFIX}"
    INTERFACE_INCLUDE_DIRECTORIES "${_zlib_build}")
  add_dependencies(fastload_zlib fastload_zlib_build)
  set(FASTLOAD_ZLIB_INCLUDE_DIR "${_zlib_build}")
  set(FASTLOAD_ZLIB_LIBRARY fastload_zlib)
endif()
fastload_third_party_source(_pyspng pyspng 0.1.4
  c715f97caf46c7d2fe1cd473114e36c7bba7d9a4ef6575b46e0e53de9354759a
  pyspng-0.1.4/vendor/libspng-0.7.4/spng/*)
set(_spng "${_pyspng}/vendor/libspng-0.7.4/spng")
add_library(fastload_spng STATIC "${_spng}/spng.c")
target_include_directories(fastload_spng SYSTEM PUBLIC "${_spng}" PRIVATE "${FASTLOAD_ZLIB_INCLUDE_DIR}")
# SPNG_STATIC: spng.h declares the functions dllimport on Windows without it.
target_compile_definitions(fastload_spng PUBLIC SPNG_STATIC)
target_link_libraries(fastload_spng PUBLIC "${FASTLOAD_ZLIB_LIBRARY}")
if(TARGET fastload_zlib_build)
  add_dependencies(fastload_spng fastload_zlib_build)  # its zlib.h is generated
endif()

# libjpeg-turbo: its own CMake (it generates its configuration headers and
# builds each source at three sample precisions), for the same target, with
# fixed options; only its static TurboJPEG library is built (the sdist lacks
# the documents its install step copies, so nothing is installed).
fastload_third_party_source(_pylibjxl pylibjxl 0.5.0
  3fea4e1a4b8fee307c4ce8c8be9f8ef14062d78baa85ee9137c234a9a2f89b79
  pylibjxl-0.5.0/third_party/libjpeg-turbo/*)
set(_jpeg_src "${_pylibjxl}/third_party/libjpeg-turbo")
set(_jpeg_build "${CMAKE_BINARY_DIR}/libjpeg-turbo")
# (An install prefix on this machine all the same: its default for Windows is c:/.)
set(_jpeg_args ${_sub_args} "-DCMAKE_INSTALL_PREFIX=${_jpeg_build}/not-installed" -DENABLE_SHARED=OFF -DENABLE_STATIC=ON -DWITH_SIMD=OFF
    -DWITH_TURBOJPEG=ON -DWITH_JAVA=OFF -DWITH_TOOLS=OFF -DWITH_TESTS=OFF -DWITH_FUZZ=OFF)
ExternalProject_Add(fastload_libjpeg_turbo_build
  SOURCE_DIR "${_jpeg_src}"
  BINARY_DIR "${_jpeg_build}"
  CMAKE_ARGS ${_jpeg_args}
  BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> --target turbojpeg-static
  BUILD_BYPRODUCTS "${_jpeg_build}/libturbojpeg.a"
  UPDATE_COMMAND "" INSTALL_COMMAND ""
  ${_sub_output})
add_library(fastload_turbojpeg STATIC IMPORTED GLOBAL)
set_target_properties(fastload_turbojpeg PROPERTIES IMPORTED_LOCATION "${_jpeg_build}/libturbojpeg.a"
  INTERFACE_INCLUDE_DIRECTORIES "${_jpeg_src}/src")
add_dependencies(fastload_turbojpeg fastload_libjpeg_turbo_build)

add_library(fastload_deps INTERFACE)
target_link_libraries(fastload_deps INTERFACE fastload_zstd fastload_xxhash fastload_lz4 fastload_spng
  fastload_turbojpeg)
