#!/bin/bash -eu
# fuzz/oss-fuzz/build.sh: an OSS-Fuzz-style build of kvguard's fuzz targets, against the Debian 12
# packages scripts/setup installs (libstdc++ builds of Abseil, Highway, OpenSSL). It is not a
# ClusterFuzzLite drop-in: fuzz/README.md says what that would still need.
# Honours the variables those builders set: $CC, $CXX, $CFLAGS, $CXXFLAGS (sanitizer and
# coverage flags), $LIB_FUZZING_ENGINE (the engine to link) and $OUT (where binaries go);
# $WORK (scratch) is optional. For every target it writes $OUT/<target>_fuzzer, its
# <target>_fuzzer.options, its dictionary and <target>_fuzzer_seed_corpus.zip.
# Local check (fuzz/README.md; CI does not run it):
#   CC=clang-14 CXX=clang++-14 CFLAGS="-fsanitize=address,undefined -fsanitize=fuzzer-no-link" \
#   CXXFLAGS="$CFLAGS" LIB_FUZZING_ENGINE=-fsanitize=fuzzer OUT=/tmp/out fuzz/oss-fuzz/build.sh
# The checkout: two levels above this script when it runs in place; OSS-Fuzz-style builders
# copy build.sh to $SRC/build.sh and the checkout to $SRC/kvguard, where that would be "/".
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ ! -f "$root/fuzz/oss-fuzz/build.sh" ]; then root="${SRC:?not in a checkout and \$SRC unset}/kvguard"; fi
if [ ! -f "$root/fuzz/oss-fuzz/build.sh" ]; then echo "build.sh: no kvguard checkout at $root" >&2; exit 1; fi
cd "$root"
: "${CFLAGS:=}" "${CXXFLAGS:=}"
build="${WORK:-/tmp}/kvguard-oss-fuzz-build"
targets=(page_ops realloc_race kernel_diff tenant_policy audit_parse audit_verify gguf_parse
         openai_request chat_template tokenizer)

cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS="$CFLAGS" -DCMAKE_CXX_FLAGS="$CXXFLAGS" \
  -DKVGUARD_FUZZ=ON -DKVGUARD_FUZZ_ENGINE="$LIB_FUZZING_ENGINE" -DKVGUARD_CUDA=OFF
cmake --build "$build" --target "${targets[@]/%/_fuzzer}"

mkdir -p "$OUT"
for t in "${targets[@]}"; do
  cp "$build/fuzz/${t}_fuzzer" "$OUT/"
  if [ -f "fuzz/$t.options" ]; then cp "fuzz/$t.options" "$OUT/${t}_fuzzer.options"; fi
  dict=$(sed -n 's/^dict *= *//p' "fuzz/$t.options" 2>/dev/null || true)
  if [ -n "$dict" ]; then cp "fuzz/$dict" "$OUT/"; fi
  if [ -d "fuzz/corpus/$t" ]; then
    python3 -c 'import sys, zipfile, pathlib
src, dst = pathlib.Path(sys.argv[1]), sys.argv[2]
with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as z:
    for f in sorted(src.iterdir()):
        if f.is_file(): z.write(f, f.name)' "fuzz/corpus/$t" "$OUT/${t}_fuzzer_seed_corpus.zip"
  fi
done
echo "oss-fuzz build: ${#targets[@]} targets in $OUT"
