// fuzz/realloc_race_fuzzer.cc: concurrent actors on one shared pool as logical threads under a
// cooperative, deterministic scheduler. Every action of a thread is one access to shared
// isolation or pool state (fuzz/harness/world.h), and the scheduler chooses which thread
// makes the next one, so the input is an interleaving. The engine itself runs its steps on
// one thread (core/engine/engine.h); these actors are a harsher world than it: prefill and decode
// steps of different requests, cancels, preemptions, copies, key and mode changes all
// interleave at every access, as they would with several engines or an offload engine on one
// pool, and every step still goes through the engine's StepGuard:
//   prefill actor    admits the waiting request the engine's scheduler picks
//                    (core::Scheduler::Admit: preempted first, then tenants in turn),
//                    verifies, writes its pages, and at the end of the prefill lets a
//                    cancelled request go (SessionPages::ContinueUnlessCancelled)
//   decode actor     runs decode steps of the prefilled requests round robin: grow, pin +
//                    verify, write, read each page, unpin + re-verify
//   submitter        opens new requests (tenant, prompt, length from the input)
//   canceller        cancels requests at the moments the schedule gives it
//   preempter        takes the pages of the request the scheduler names as the victim
//                    (core::Scheduler::Victim: the newest admitted) among those between
//                    their decode steps
//   copy engine      asynchronous page copies: begin, read, end
//   key rotator      rotates the tag key, then retires the old ones
//   admin            changes tenants' modes
//   fault injector   (one input in two) injects the faults of world.h at scheduled moments
// Two schedulers, picked by the first byte: random (each step's thread is read from the
// input) and PCT (Burckhardt et al. 2010: random priorities plus up to three priority change
// points, all read from the input), which reaches bugs that need a few ordering constraints
// with far fewer tries. A failing input replays exactly: nothing here depends on time,
// threads or addresses. KVGUARD_FUZZ_TRACE=1 prints every action.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <vector>

#include "fuzz/harness/world.h"
#include "fuzz/planted.h"

namespace kvguard::fuzz {
namespace {

constexpr int kMaxSteps = 1500;

// A logical thread: Step makes one action and returns false if it could not (blocked: it
// is retried after some other thread made progress); done when its program is over.
struct Thread {
  const char* name;
  std::function<bool()> step;
  std::function<bool()> done;
  int priority = 0;
  bool blocked = false;
};

void Run(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  WorldOptions options;
  options.planted = kPlantedBug;
  World w(options);
  w.set_echo(std::getenv("KVGUARD_FUZZ_TRACE") != nullptr);
  const bool pct = in.ConsumeBool();
  const bool faults = in.ConsumeBool();

  // Programs: how many operations each actor makes, and their arguments, drawn lazily from
  // the input as they run.
  int to_submit = in.ConsumeIntegralInRange(2, 10);
  int to_cancel = in.ConsumeIntegralInRange(0, 3);
  int to_preempt = in.ConsumeIntegralInRange(0, 3);
  int to_copy = in.ConsumeIntegralInRange(0, 3) * 3;
  int to_rotate = in.ConsumeIntegralInRange(0, 2) * 2;
  int to_mode = in.ConsumeIntegralInRange(0, 2);
  int to_fault = faults ? in.ConsumeIntegralInRange(1, 3) : 0;
  int copy_target = -1;
  int decode_next = 0;

  auto first_prefill = [&]() -> int {
    for (int r = 0; r < w.num_requests(); ++r) {
      if (w.live(r) && (w.waiting(r) || w.phase(r) <= World::Phase::kPrefillFinish)) return r;
    }
    return -1;
  };
  // The engine's scheduler takes the scheduling decisions: greedy admission (ratio 0, no
  // reserve), so that the small pool runs as many requests at once as it can hold.
  core::SchedulerOptions so;
  so.max_batch = WorldOptions().max_requests;
  so.reserve_pages = 0;
  so.admission_ratio = 0;
  so.step_tokens = so.max_batch;
  core::Scheduler scheduler(so);
  // Requests the scheduler sees: `in_flight` (admitted, oldest admission first; those that
  // `now` accepts) or waiting (queue order), with their world indices.
  std::vector<core::SchedRequest> waiting, in_flight;
  std::vector<int> waiting_index, in_flight_index;
  auto describe = [&](const std::function<bool(int)>& now) {
    waiting.clear(), in_flight.clear(), waiting_index.clear(), in_flight_index.clear();
    for (int r = 0; r < w.num_requests(); ++r) {
      if (!w.live(r)) continue;
      if (w.waiting(r)) {
        waiting.push_back(w.Describe(r));
        waiting_index.push_back(r);
      } else if (now(r)) {
        in_flight_index.push_back(r);
      }
    }
    std::sort(in_flight_index.begin(), in_flight_index.end(),
              [&](int a, int b) { return w.admitted_at(a) < w.admitted_at(b); });
    for (int r : in_flight_index) in_flight.push_back(w.Describe(r));
  };
  auto any_live = [&]() {
    for (int r = 0; r < w.num_requests(); ++r) {
      if (w.live(r)) return true;
    }
    return false;
  };

  std::vector<Thread> threads;
  threads.push_back(
      {"prefill",
       [&]() {
         // A prefill under way (or a cancelled request that waits) goes on;
         // else the scheduler admits one.
         for (int r = 0; r < w.num_requests(); ++r) {
           if (w.live(r) && !w.waiting(r) && w.phase(r) <= World::Phase::kPrefillFinish) {
             return w.Advance(r);
           }
           if (w.waiting(r) && w.cancelled(r)) return w.Advance(r);
         }
         describe([](int) { return true; });
         const std::optional<size_t> a = scheduler.Admit(waiting, in_flight, w.free_pages());
         if (!a || !w.Advance(waiting_index[*a])) return false;
         scheduler.Admitted(waiting[*a].tenant);
         return true;
       },
       [&]() { return to_submit == 0 && first_prefill() < 0; }});
  threads.push_back({"decode",
                     [&]() {
                       // Round robin over the handed-over requests, one action each.
                       const int n = w.num_requests();
                       for (int k = 0; k < n; ++k) {
                         const int r = (decode_next + k) % n;
                         if (!w.live(r) || w.waiting(r) || w.phase(r) < World::Phase::kDecodeGrow) {
                           continue;
                         }
                         if (w.Advance(r)) {
                           // Stay on a request for the whole step; move on between steps.
                           decode_next = w.in_step(r) ? r : r + 1;
                           return true;
                         }
                       }
                       return false;
                     },
                     [&]() { return to_submit == 0 && !any_live(); }});
  threads.push_back({"submitter",
                     [&]() {
                       const int tenant = in.ConsumeIntegralInRange(0, 2);
                       const int prompt = in.ConsumeIntegralInRange(1, 13);
                       const int gen = in.ConsumeIntegralInRange(1, 8);
                       --to_submit;
                       return w.Open(tenant, prompt, gen);
                     },
                     [&]() { return to_submit == 0; }});
  threads.push_back({"canceller",
                     [&]() {
                       if (w.num_requests() == 0) return false;
                       --to_cancel;
                       return w.Cancel(in.ConsumeIntegralInRange(0, w.num_requests() - 1));
                     },
                     [&]() { return to_cancel == 0; }});
  threads.push_back({"preempter",
                     [&]() {
                       describe([&](int r) { return w.phase(r) == World::Phase::kDecodeGrow; });
                       if (in_flight.empty()) return false;
                       if (!w.Preempt(in_flight_index[scheduler.Victim(in_flight)])) return false;
                       scheduler.Preempted();
                       --to_preempt;
                       return true;
                     },
                     [&]() { return to_preempt == 0; }});
  threads.push_back(
      {"copy",
       [&]() {
         if (copy_target < 0 || !w.has_copy(copy_target)) {
           if (w.num_requests() == 0) return false;
           copy_target = in.ConsumeIntegralInRange(0, w.num_requests() - 1);
         }
         if (!w.CopyStep(copy_target, in.ConsumeIntegralInRange(0, 7))) {
           copy_target = -1;
           return false;
         }
         --to_copy;
         return true;
       },
       [&]() { return to_copy <= 0 && (copy_target < 0 || !w.has_copy(copy_target)); }});
  threads.push_back({"keys",
                     [&]() {
                       const bool rotate = to_rotate % 2 == 0;
                       --to_rotate;
                       return rotate ? w.RotateKey() : w.RetireOldKeys();
                     },
                     [&]() { return to_rotate <= 0; }});
  threads.push_back({"admin",
                     [&]() {
                       const int tenant = in.ConsumeIntegralInRange(0, 2);
                       --to_mode;
                       return w.SetMode(
                           tenant, static_cast<isolation::Mode>(in.ConsumeIntegralInRange(0, 2)));
                     },
                     [&]() { return to_mode == 0; }});
  threads.push_back({"faults",
                     [&]() {
                       if (w.num_requests() == 0) return false;
                       const auto f = static_cast<Fault>(
                           in.ConsumeIntegralInRange(0, static_cast<int>(Fault::kCount) - 1));
                       const int r = in.ConsumeIntegralInRange(0, w.num_requests() - 1);
                       if (!w.Inject(f, r, in.ConsumeIntegral<uint32_t>())) return false;
                       --to_fault;
                       return true;
                     },
                     [&]() { return to_fault <= 0; }});

  // PCT: distinct random priorities, and change points (step numbers) at which the running
  // thread drops below every other.
  std::array<int, 3> change_points{-1, -1, -1};
  if (pct) {
    std::vector<int> order(threads.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    for (size_t i = order.size(); i > 1; --i) {
      std::swap(order[i - 1], order[in.ConsumeIntegralInRange<size_t>(0, i - 1)]);
    }
    for (size_t i = 0; i < threads.size(); ++i) threads[i].priority = 100 + order[i];
    const int depth = in.ConsumeIntegralInRange(0, 3);
    for (int d = 0; d < depth; ++d) change_points[size_t(d)] = in.ConsumeIntegralInRange(0, 400);
  }

  int lowered = 0;
  for (int step = 0; step < kMaxSteps; ++step) {
    std::vector<size_t> runnable;
    for (size_t i = 0; i < threads.size(); ++i) {
      if (!threads[i].blocked && !threads[i].done()) runnable.push_back(i);
    }
    if (runnable.empty()) break;  // every thread done or blocked: quiescent
    size_t pick;
    if (pct) {
      pick = *std::max_element(runnable.begin(), runnable.end(), [&](size_t a, size_t b) {
        return threads[a].priority < threads[b].priority;
      });
      if (std::find(change_points.begin(), change_points.end(), step) != change_points.end()) {
        threads[pick].priority = -(++lowered);
      }
    } else {
      if (in.remaining_bytes() == 0) break;
      pick = runnable[in.ConsumeIntegralInRange<size_t>(0, runnable.size() - 1)];
    }
    if (threads[pick].step()) {
      for (Thread& t : threads) t.blocked = false;
    } else {
      threads[pick].blocked = true;
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
