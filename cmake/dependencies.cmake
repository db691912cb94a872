# Finds the C libraries of the core (LMDB, zstd, xxHash) and, when one is
# missing, stops with the package names to install instead of a stack trace.
# Defines the interface target fastload_deps.

set(_missing "")
find_path(LMDB_INCLUDE_DIR lmdb.h)
find_library(LMDB_LIBRARY NAMES lmdb liblmdb)
if(NOT LMDB_INCLUDE_DIR OR NOT LMDB_LIBRARY)
  list(APPEND _missing "LMDB")
endif()
find_path(ZSTD_INCLUDE_DIR zstd.h)
find_library(ZSTD_LIBRARY NAMES zstd libzstd zstd_static)
if(NOT ZSTD_INCLUDE_DIR OR NOT ZSTD_LIBRARY)
  list(APPEND _missing "zstd")
endif()
find_path(XXHASH_INCLUDE_DIR xxhash.h)
find_library(XXHASH_LIBRARY NAMES xxhash libxxhash)
if(NOT XXHASH_INCLUDE_DIR OR NOT XXHASH_LIBRARY)
  list(APPEND _missing "xxHash")
endif()

if(_missing)
  string(REPLACE ";" ", " _missing_text "${_missing}")
  message(FATAL_ERROR
    "\nfastload: the C libraries ${_missing_text} were not found. Install them and build again:\n"
    "  Debian/Ubuntu: sudo apt-get install liblmdb-dev libzstd-dev libxxhash-dev\n"
    "  Fedora/RHEL:   sudo dnf install lmdb-devel libzstd-devel xxhash-devel\n"
    "  macOS:         brew install lmdb zstd xxhash\n"
    "  conda:         conda install -c conda-forge lmdb zstd xxhash\n"
    "  vcpkg:         vcpkg install lmdb zstd xxhash\n"
    "(or point CMAKE_PREFIX_PATH at where they are installed).\n")
endif()

add_library(fastload_deps INTERFACE)
target_include_directories(fastload_deps INTERFACE ${LMDB_INCLUDE_DIR} ${ZSTD_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR})
target_link_libraries(fastload_deps INTERFACE ${LMDB_LIBRARY} ${ZSTD_LIBRARY} ${XXHASH_LIBRARY})
