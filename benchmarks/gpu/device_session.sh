#!/bin/bash
# Run on a lent GPU machine from the repo root (carry .gpu and .whl; see the header below for what they hold):
#   .gpu/prefix: Debian libzstd-dev, libxxhash-dev extracted (static .a + headers); .gpu/lmdbsrc: mdb.c midl.c lmdb.h midl.h
#   (py-lmdb sdist); .gpu/old, .gpu/head: git archive of the commits to compare; .whl: cp312 wheels of lmdb, zstandard.
# Third device call: build old (a8c9a8e, before issue 9), head (main) and work (this tree); CUDA tests on work;
# idiom on old and work; consumer cost and thread sweeps on all three.
set -u
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONUNBUFFERED=1
exec > >(tee $OUT/log3.txt) 2>&1
cd "$(dirname "$0")/../.."
t0=$(date +%s)
[ -d /tmp/site/lmdb ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
(cd .gpu/lmdbsrc && gcc -O2 -fPIC -pthread -c mdb.c midl.c && ar rcs liblmdb.a mdb.o midl.o) || exit 1
P=$PWD/.gpu/prefix/usr; L=$P/lib/x86_64-linux-gnu
DEFS="-C cmake.define.ZSTD_INCLUDE_DIR=$P/include -C cmake.define.ZSTD_LIBRARY=$L/libzstd.a -C cmake.define.XXHASH_INCLUDE_DIR=$P/include -C cmake.define.XXHASH_LIBRARY=$L/libxxhash.a -C cmake.define.LMDB_INCLUDE_DIR=$PWD/.gpu/lmdbsrc -C cmake.define.LMDB_LIBRARY=$PWD/.gpu/lmdbsrc/liblmdb.a"
export CMAKE_BUILD_PARALLEL_LEVEL=6
pids=""
for v in old head work; do
  src=.gpu/$v; [ $v = work ] && src=.
  rm -rf /tmp/$v /tmp/build-$v
  (cd $src && timeout 240 python3 -m pip install -q --no-index --no-build-isolation --no-deps --no-compile --target /tmp/$v -C build-dir=/tmp/build-$v $DEFS . > /tmp/build-$v.log 2>&1 || tail -20 /tmp/build-$v.log) &
  pids="$pids $!"
done
wait $pids
echo "built in $(( $(date +%s) - t0 )) s"; ls -d /tmp/old/fastload /tmp/head/fastload /tmp/work/fastload
W=/tmp/work:/tmp/site
echo "=== CUDA tests on work"
PYTHONPATH=$W timeout 200 python3 -m pytest tests/test_cuda.py tests/test_device.py tests/test_loader.py -ra -q -p no:cacheprovider 2>&1 | tail -6
PYTHONPATH=$W timeout 100 python3 benchmarks/gpu_check.py 2>&1 | grep -v "loader stats"
for v in old work; do mkdir -p /tmp/d$v; PYTHONPATH=/tmp/$v:/tmp/site timeout 150 python3 benchmarks/gpu/nonblocking_idiom.py /tmp/d$v; done
echo "=== consumer cost"
for v in old head work; do
  [ -d /tmp/d$v/small ] || PYTHONPATH=/tmp/$v:/tmp/site python3 benchmarks/gpu/nonblocking_idiom.py /tmp/d$v --write-only
  PYTHONPATH=/tmp/$v:/tmp/site timeout 100 python3 benchmarks/gpu/consumer_cost.py /tmp/d$v/small
done
echo "=== sweeps"
for v in old head work; do
  [ $(( $(date +%s) - t0 )) -gt 480 ] && { echo "skip sweep $v: out of time"; continue; }
  PYTHONPATH=/tmp/$v:/tmp/site timeout 100 python3 benchmarks/gpu/thread_sweep.py /tmp/d$v
done
echo "=== done at $(( $(date +%s) - t0 )) s"
