#include "tests/core/model/tiny_model.h"

#include "core/model/synthetic_model.h"

namespace kvguard::core {

const TinyModel& Fp32Tiny() {
  static const TinyModel* s = [] {
    auto* tiny = new TinyModel;
    auto source = *MakeBuiltinSource("tiny", 1);
    ModelOptions mo;
    mo.prefill_weights = kernels::WeightFormat::kFp32;
    mo.decode_weights = kernels::WeightFormat::kFp32;
    tiny->model = *Model::Load(*source, mo, nullptr);
    tiny->tokenizer = *ByteTokenizer::Create(tiny->model->config().vocab_size);
    return tiny;
  }();
  return *s;
}

}  // namespace kvguard::core
