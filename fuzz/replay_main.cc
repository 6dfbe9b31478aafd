// fuzz/replay_main.cc: a main() for fuzz targets without libFuzzer (gcc builds, the default
// and asan presets): runs LLVMFuzzerTestOneInput once on every file named on the command line
// (a directory: every regular file in it, in name order). ctest uses it to replay each
// target's seed corpus and saved reproducers (fuzz/regressions/), so a fixed bug stays fixed.
// Exits 1 if a path cannot be read or nothing at all was replayed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> in_dir;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        if (e.is_regular_file()) in_dir.push_back(e.path());
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else if (!fs::exists(p, ec)) {
      std::fprintf(stderr, "replay: %s does not exist (skipped)\n", argv[i]);
    } else {
      std::fprintf(stderr, "replay: cannot read %s\n", argv[i]);
      return 1;
    }
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "replay: cannot read %s\n", f.c_str());
      return 1;
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %zu inputs passed\n", files.size());
  if (files.empty()) {
    std::fprintf(stderr, "replay: no inputs found: nothing was tested\n");
    return 1;
  }
  return 0;
}
