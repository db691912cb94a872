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
#   lib      PyPI sdist            bundled as
#   zstd     zstandard 0.23.0      zstd/zstd.c (single-file zstd 1.5.6) + headers
#   xxHash   xxhash 3.5.0          deps/xxhash/xxhash.{c,h} (xxHash 0.8.2)
#   LMDB     lmdb 3.0.0            lib/mdb.c, midl.c (LMDB 0.9.36, without py-lmdb's patches)
# The core reads shards without liblmdb: LMDB is built only for
# csrc/tests/lmdb_readonly_tests.cpp, which checks py-lmdb's read-only
# opening of shards on Windows.

enable_language(C)
set(FASTLOAD_DOWNLOAD_PYTHON "python3" CACHE STRING "A Python with pip, used to download the source archives")
set(FASTLOAD_THIRD_PARTY_DOWNLOADS "${CMAKE_BINARY_DIR}/third-party-downloads" CACHE PATH
    "Where the pinned source archives are downloaded (and reused when their hash matches)")

# Downloads (when missing) and checks PyPI sdist NAME==VERSION, then extracts
# PATTERNS from it; sets <VAR> to the extracted top directory.
function(fastload_third_party_source VAR NAME VERSION SHA256)
  set(archive "${FASTLOAD_THIRD_PARTY_DOWNLOADS}/${NAME}-${VERSION}.tar.gz")
  if(EXISTS "${archive}")
    file(SHA256 "${archive}" have)
  endif()
  if(NOT EXISTS "${archive}" OR NOT have STREQUAL SHA256)
    file(REMOVE "${archive}")
    message(STATUS "fastload: downloading the ${NAME} ${VERSION} source distribution from PyPI")
    execute_process(
      COMMAND ${FASTLOAD_DOWNLOAD_PYTHON} -m pip download --quiet --no-deps --no-binary :all:
              --no-build-isolation -d "${FASTLOAD_THIRD_PARTY_DOWNLOADS}" "${NAME}==${VERSION}"
      RESULT_VARIABLE rc)
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
    file(ARCHIVE_EXTRACT INPUT "${archive}" DESTINATION "${dest}" PATTERNS ${ARGN})
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

add_library(fastload_deps INTERFACE)
target_link_libraries(fastload_deps INTERFACE fastload_zstd fastload_xxhash)
