#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "kernels/cpu/dispatch.h"
#include "tools/commands.h"
#ifdef KVGUARD_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

#ifndef KVGUARD_BUILD_TYPE
#define KVGUARD_BUILD_TYPE "unknown"
#endif
#ifndef KVGUARD_VERSION
#define KVGUARD_VERSION "unknown"
#endif

namespace kvguard::tools {
namespace {

std::string Compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return "gcc " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
         std::to_string(__GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

std::string Sanitizers() {
  std::vector<std::string> s;
#if defined(__SANITIZE_ADDRESS__)
  s.push_back("address");
#endif
#if defined(__SANITIZE_THREAD__)
  s.push_back("thread");
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
  s.push_back("address");
#endif
#if __has_feature(thread_sanitizer)
  s.push_back("thread");
#endif
#endif
  return s.empty() ? "none" : absl::StrJoin(s, ",");
}

}  // namespace

std::string CpuModel() {
  // The model name alone can be generic in VMs ("AMD EPYC"); family and model tell the
  // microarchitecture (AMD family 25 model 17: Zen 4).
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "unknown", family, model;
  auto value = [&line] {
    const size_t colon = line.find(':');
    return colon == std::string::npos ? std::string()
                                      : line.substr(line.find_first_not_of(' ', colon + 1));
  };
  while (std::getline(in, line) && line.find_first_not_of(" \t") != std::string::npos) {
    if (line.rfind("model name", 0) == 0) name = value();
    if (line.rfind("cpu family", 0) == 0) family = value();
    if (line.rfind("model\t", 0) == 0 || line.rfind("model :", 0) == 0) model = value();
  }
  return family.empty() ? name : name + " (family " + family + ", model " + model + ")";
}

std::string BuildDescription() {
  std::string cuda;
#ifdef KVGUARD_HAVE_CUDA
  cuda = "yes (" + kernels::cuda::DeviceSummary() + ")";
#else
  cuda = "no (built without nvcc)";
#endif
  return std::string("kvguard ") + KVGUARD_VERSION + "\n" + "build: " + KVGUARD_BUILD_TYPE +
         ", compiler " + Compiler() + ", C++" + std::to_string(__cplusplus / 100 % 100) +
         ", sanitizers " + Sanitizers() + "\n" +
         "simd targets compiled: " + absl::StrJoin(kernels::CompiledTargets(), " ") + "\n" +
         "simd target selected: " + kernels::SelectedTarget() + "\n" + "cpu: " + CpuModel() + "\n" +
         "cuda: " + cuda + "\n";
}

int RunVersion(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "kvguard version: takes no arguments\n");
    return 2;
  }
  std::fputs(BuildDescription().c_str(), stdout);
  return 0;
}

}  // namespace kvguard::tools
