// tests/core/shared_models.h: where tests find the real models of ../shared/models.
#ifndef KVGUARD_TESTS_CORE_SHARED_MODELS_H_
#define KVGUARD_TESTS_CORE_SHARED_MODELS_H_

#include <sys/stat.h>

#include <cstdlib>
#include <string>

namespace kvguard::core::testing {

// SharedModelPath returns the path of `file` in $KVGUARD_SHARED_MODELS, else in
// ${CMAKE_SOURCE_DIR}/../shared/models (compiled in as KVGUARD_SHARED_MODELS_DIR), or "" when
// it is not there (the caller skips, saying so).
inline std::string SharedModelPath(const std::string& file) {
  const char* env = std::getenv("KVGUARD_SHARED_MODELS");
  const std::string dir = env != nullptr && env[0] != '\0' ? env : KVGUARD_SHARED_MODELS_DIR;
  const std::string path = dir + "/" + file;
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? path : std::string();
}

}  // namespace kvguard::core::testing

#endif  // KVGUARD_TESTS_CORE_SHARED_MODELS_H_
