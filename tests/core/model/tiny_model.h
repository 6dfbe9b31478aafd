// tests/core/model/tiny_model.h: the `tiny` built-in model with FP32 weights in both phases, loaded
// once per test binary (loading is the slow part), and its byte tokenizer.
#ifndef KVGUARD_TESTS_CORE_MODEL_TINY_MODEL_H_
#define KVGUARD_TESTS_CORE_MODEL_TINY_MODEL_H_

#include <memory>

#include "core/model/model.h"
#include "core/text/tokenizer.h"

namespace kvguard::core {

struct TinyModel {
  std::shared_ptr<Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;
};

// Fp32Tiny returns the shared tiny model (seed 1).
const TinyModel& Fp32Tiny();

}  // namespace kvguard::core

#endif  // KVGUARD_TESTS_CORE_MODEL_TINY_MODEL_H_
