// tests/audit/test_files.h: file helpers the audit tests share (they corrupt logs on disk).
#ifndef KVGUARD_TESTS_AUDIT_TEST_FILES_H_
#define KVGUARD_TESTS_AUDIT_TEST_FILES_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "tests/temp_dir.h"

namespace kvguard::audit::testing {

// NewTempDir returns a fresh directory under the test's temporary directory.
inline std::string NewTempDir() { return tests::NewTempDir("audit_test"); }

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

inline void AppendFile(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

}  // namespace kvguard::audit::testing

#endif  // KVGUARD_TESTS_AUDIT_TEST_FILES_H_
