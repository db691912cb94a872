# Finds the C libraries of the core (zstd, xxHash, lz4, libspng, libjpeg-turbo's
# TurboJPEG) and, when one is missing, stops with the package names to install
# instead of a stack trace. The core reads LMDB shards without liblmdb
# (csrc/reader/shard_reader.h).
# Defines the interface target fastload_deps.

# A prefix of them built by cmake/third_party_prefix (scripts/build_wheel.sh caches one per recipe and
# toolchain): linked from there as they are, nothing searched for on the system.
set(FASTLOAD_THIRD_PARTY_PREFIX "" CACHE PATH
    "The static C libraries and their headers as cmake/third_party_prefix installs them (empty: find them)")
if(FASTLOAD_THIRD_PARTY_PREFIX)
  set(_archives "")
  foreach(_name fastload_zstd fastload_xxhash fastload_lz4 fastload_spng z turbojpeg)  # libspng before zlib
    set(_archive "${FASTLOAD_THIRD_PARTY_PREFIX}/lib/lib${_name}.a")
    if(NOT EXISTS "${_archive}")
      message(FATAL_ERROR "fastload: ${_archive} is missing: FASTLOAD_THIRD_PARTY_PREFIX must be a prefix that "
                          "cmake/third_party_prefix installed (scripts/build_wheel.sh builds one)")
    endif()
    list(APPEND _archives "${_archive}")
  endforeach()
  message(STATUS "fastload: the C libraries from ${FASTLOAD_THIRD_PARTY_PREFIX}")
  add_library(fastload_deps INTERFACE)
  target_include_directories(fastload_deps SYSTEM INTERFACE "${FASTLOAD_THIRD_PARTY_PREFIX}/include")
  target_compile_definitions(fastload_deps INTERFACE SPNG_STATIC)  # as the from-source build (spng.h, Windows)
  target_link_libraries(fastload_deps INTERFACE ${_archives})
  return()
endif()

set(_missing "")
# Finds header HEADER into <PREFIX>_INCLUDE_DIR and one of the library NAMES into <PREFIX>_LIBRARY (cache
# variables, so -D<PREFIX>_LIBRARY=... overrides them); adds LABEL to _missing when either is not found.
function(fastload_find_c_library PREFIX LABEL HEADER)
  find_path(${PREFIX}_INCLUDE_DIR ${HEADER})
  find_library(${PREFIX}_LIBRARY NAMES ${ARGN})
  if(NOT ${PREFIX}_INCLUDE_DIR OR NOT ${PREFIX}_LIBRARY)
    set(_missing ${_missing} "${LABEL}" PARENT_SCOPE)
  endif()
endfunction()
fastload_find_c_library(ZSTD "zstd" zstd.h zstd libzstd zstd_static)
fastload_find_c_library(XXHASH "xxHash" xxhash.h xxhash libxxhash)
fastload_find_c_library(LZ4 "lz4" lz4.h lz4 liblz4)
fastload_find_c_library(SPNG "libspng" spng.h spng libspng spng_static)
fastload_find_c_library(TURBOJPEG "TurboJPEG (libjpeg-turbo)" turbojpeg.h turbojpeg libturbojpeg turbojpeg-static)

if(_missing AND FASTLOAD_THIRD_PARTY_FROM_SOURCE STREQUAL "AUTO")
  string(REPLACE ";" ", " _missing_text "${_missing}")
  message(STATUS "fastload: ${_missing_text} not found on this system: building the C libraries from "
                 "pinned source archives (FASTLOAD_THIRD_PARTY_FROM_SOURCE=AUTO; OFF makes this an error)")
  include(${CMAKE_CURRENT_LIST_DIR}/third_party_windows.cmake)
  return()
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
