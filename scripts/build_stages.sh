# Sourced by the build scripts (build_wheel.sh, test_wheel.sh, test_sdist.sh): stages that say what
# they do and how long it took, and where the build cache is.
#
#   stage "what"        prints "== what ..."
#   stage_done [note]   prints "== what done in N s (note)"
#   FASTLOAD_BUILD_CACHE  the build cache (default ${XDG_CACHE_HOME:-~/.cache}/fastload-build; "off": none).
#                         Apart from ~/.cache/fastload, the loader's own cache of remote shards.

stage() { STAGE=$1; STAGE_T0=$SECONDS; echo "== $STAGE ..."; }
stage_done() { echo "== $STAGE done in $((SECONDS - STAGE_T0)) s${1:+ ($1)}"; }

BUILD_CACHE=${FASTLOAD_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fastload-build}
