#!/bin/bash -eu
# fuzz/oss-fuzz/build.sh: the OSS-Fuzz / ClusterFuzzLite build of kvguard's fuzz targets.
# Honours the variables those builders set: $CC, $CXX, $CFLAGS, $CXXFLAGS (sanitizer and
# coverage flags), $LIB_FUZZING_ENGINE (the engine to link) and $OUT (where binaries go);
# $WORK (scratch) is optional. For every target it writes $OUT/<target>_fuzzer, its
# <target>_fuzzer.options, its dictionary and <target>_fuzzer_seed_corpus.zip.
# Local check, as CI and fuzz/README.md do it:
#   CC=clang-14 CXX=clang++-14 CFLAGS="-fsanitize=address,undefined -fsanitize=fuzzer-no-link" \
#   CXXFLAGS="$CFLAGS" LIB_FUZZING_ENGINE=-fsanitize=fuzzer OUT=/tmp/out fuzz/oss-fuzz/build.sh
cd "$(dirname "$0")/../.."
: "${CFLAGS:=}" "${CXXFLAGS:=}"
build="${WORK:-/tmp}/kvguard-oss-fuzz-build"
targets=(page_ops realloc_race kernel_diff tenant_policy audit_parse audit_verify gguf_parse
         openai_request)

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
