// fuzz/page_ops_fuzzer.cc: a sequence of page-lifecycle operations over three tenants
// (enforce, strict, off) and up to 16 requests, chosen by the input: open, advance one
// request by one action (grant, verify, write or read one page, finish a step),
// cancel, preempt, asynchronous copies, key rotation and retirement, mode changes, and
// injected faults. fuzz/harness/world.h holds the shadow model and the oracles.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>

#include "fuzz/harness/world.h"
#include "fuzz/planted.h"

namespace kvguard::fuzz {
namespace {

constexpr int kMaxActions = 512;

int PickRequest(FuzzedDataProvider& in, const World& w) {
  return w.num_requests() == 0 ? 0 : in.ConsumeIntegralInRange(0, w.num_requests() - 1);
}

void Run(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  WorldOptions options;
  options.planted = kPlantedBug;
  World w(options);
  w.set_echo(std::getenv("KVGUARD_FUZZ_TRACE") != nullptr);
  for (int n = 0; n < kMaxActions && in.remaining_bytes() > 0; ++n) {
    const int op = in.ConsumeIntegralInRange(0, 15);
    switch (op) {
      case 0:
      case 1: {
        const int tenant = in.ConsumeIntegralInRange(0, 2);
        const int prompt = in.ConsumeIntegralInRange(1, 13);
        const int gen = in.ConsumeIntegralInRange(1, 10);
        w.Open(tenant, prompt, gen);
        break;
      }
      case 2:
        w.Cancel(PickRequest(in, w));
        break;
      case 3:
        w.Preempt(PickRequest(in, w));
        break;
      case 4: {
        const int r = PickRequest(in, w);
        w.CopyStep(r, in.ConsumeIntegralInRange(0, 7));
        break;
      }
      case 5:
        if (in.ConsumeBool()) {
          w.RotateKey();
        } else {
          w.RetireOldKeys();
        }
        break;
      case 6: {
        const int tenant = in.ConsumeIntegralInRange(0, 2);
        w.SetMode(tenant, static_cast<isolation::Mode>(in.ConsumeIntegralInRange(0, 2)));
        break;
      }
      case 7: {
        const auto f =
            static_cast<Fault>(in.ConsumeIntegralInRange(0, static_cast<int>(Fault::kCount) - 1));
        const int r = PickRequest(in, w);
        w.Inject(f, r, in.ConsumeIntegral<uint32_t>());
        break;
      }
      default:  // advancing requests is most of what an engine does
        w.Advance(PickRequest(in, w));
        break;
    }
    w.CheckInvariants();
  }
  w.Finish();
}

}  // namespace
}  // namespace kvguard::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvguard::fuzz::Run(data, size);
  return 0;
}
