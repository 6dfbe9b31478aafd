#include "kernels/cpu/dispatch.h"

#include "hwy/targets.h"

namespace kvguard::kernels {

std::vector<std::string> CompiledTargets() {
  std::vector<std::string> names;
  for (int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) {
    names.push_back(hwy::TargetName(bits & -bits));
  }
  return names;
}

std::vector<int64_t> SupportedTargets() { return hwy::SupportedAndGeneratedTargets(); }

std::string SelectedTarget() {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

// Both re-point the dispatch tables explicitly: HWY_DYNAMIC_DISPATCH caches its choice in
// the ChosenTarget, which must follow the mocked set of supported targets.
void ForceTarget(int64_t target) {
  hwy::SetSupportedTargetsForTest(target);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

void ResetTarget() {
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

std::string TargetName(int64_t target) { return hwy::TargetName(target); }

}  // namespace kvguard::kernels
