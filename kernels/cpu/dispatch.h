// kernels/cpu/dispatch.h: which SIMD targets are compiled in and which one runs.
#ifndef KVGUARD_KERNELS_CPU_DISPATCH_H_
#define KVGUARD_KERNELS_CPU_DISPATCH_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvguard::kernels {

// CompiledTargets returns the names of the Highway targets compiled into kvguard.
std::vector<std::string> CompiledTargets();

// SelectedTarget returns the name of the best compiled target this CPU supports: the one
// runtime dispatch uses.
std::string SelectedTarget();

// SupportedTargets returns the Highway target bits that are both compiled in and supported by
// this CPU, best first. Tests iterate over these with ForceTarget.
std::vector<int64_t> SupportedTargets();

// ForceTarget makes runtime dispatch use `target` (one of SupportedTargets()) until
// ResetTarget(). For tests and benchmarks only; not thread-safe against running kernels.
void ForceTarget(int64_t target);
void ResetTarget();

// TargetName returns the Highway name of target bit `target`.
std::string TargetName(int64_t target);

}  // namespace kvguard::kernels

#endif  // KVGUARD_KERNELS_CPU_DISPATCH_H_
