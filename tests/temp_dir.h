// tests/temp_dir.h: the fresh directory a test writes its files into.
#ifndef KVGUARD_TESTS_TEMP_DIR_H_
#define KVGUARD_TESTS_TEMP_DIR_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace kvguard::tests {

// NewTempDir returns a new, empty directory <gtest's temporary directory>/<prefix>.XXXXXX (the
// test fails if it cannot be made). The caller removes it.
inline std::string NewTempDir(const std::string& prefix) {
  std::string tmpl = ::testing::TempDir() + "/" + prefix + ".XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr) << tmpl;
  return tmpl;
}

}  // namespace kvguard::tests

#endif  // KVGUARD_TESTS_TEMP_DIR_H_
