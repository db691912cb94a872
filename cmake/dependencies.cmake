# Finds the C libraries of the core (zstd, xxHash, lz4, libspng, libjpeg-turbo's
# TurboJPEG) and, when one is missing, stops with the package names to install
# instead of a stack trace. The core reads LMDB shards without liblmdb
# (csrc/reader/shard_reader.h).
# Defines the interface target fastload_deps.

set(_missing "")
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

find_path(LZ4_INCLUDE_DIR lz4.h)
find_library(LZ4_LIBRARY NAMES lz4 liblz4)
if(NOT LZ4_INCLUDE_DIR OR NOT LZ4_LIBRARY)
  list(APPEND _missing "lz4")
endif()
find_path(SPNG_INCLUDE_DIR spng.h)
find_library(SPNG_LIBRARY NAMES spng libspng spng_static)
if(NOT SPNG_INCLUDE_DIR OR NOT SPNG_LIBRARY)
  list(APPEND _missing "libspng")
endif()
find_path(TURBOJPEG_INCLUDE_DIR turbojpeg.h)
find_library(TURBOJPEG_LIBRARY NAMES turbojpeg libturbojpeg turbojpeg-static)
if(NOT TURBOJPEG_INCLUDE_DIR OR NOT TURBOJPEG_LIBRARY)
  list(APPEND _missing "TurboJPEG (libjpeg-turbo)")
endif()

if(_missing)
  string(REPLACE ";" ", " _missing_text "${_missing}")
  message(FATAL_ERROR
    "\nfastload: the C libraries ${_missing_text} were not found. Install them and build again:\n"
    "  Debian/Ubuntu: sudo apt-get install libzstd-dev libxxhash-dev liblz4-dev libspng-dev libturbojpeg0-dev\n"
    "  Fedora/RHEL:   sudo dnf install libzstd-devel xxhash-devel lz4-devel libspng-devel turbojpeg-devel\n"
    "  macOS:         brew install zstd xxhash lz4 libspng jpeg-turbo\n"
    "  conda:         conda install -c conda-forge zstd xxhash lz4-c libspng libjpeg-turbo\n"
    "  vcpkg:         vcpkg install zstd xxhash lz4 libspng libjpeg-turbo\n"
    "  Windows:       vcpkg install zstd:x64-windows-static-md xxhash:x64-windows-static-md lz4:x64-windows-static-md\n"
    "                 libspng:x64-windows-static-md libjpeg-turbo:x64-windows-static-md, then\n"
    "                 pip install . -C cmake.define.CMAKE_PREFIX_PATH=<vcpkg>/installed/x64-windows-static-md\n"
    "                 (README.md, \"Building on Windows\")\n"
    "(or point CMAKE_PREFIX_PATH at where they are installed).\n")
endif()

add_library(fastload_deps INTERFACE)
target_include_directories(fastload_deps INTERFACE ${ZSTD_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR}
  ${LZ4_INCLUDE_DIR} ${SPNG_INCLUDE_DIR} ${TURBOJPEG_INCLUDE_DIR})
target_link_libraries(fastload_deps INTERFACE ${ZSTD_LIBRARY} ${XXHASH_LIBRARY}
  ${LZ4_LIBRARY} ${SPNG_LIBRARY} ${TURBOJPEG_LIBRARY})
