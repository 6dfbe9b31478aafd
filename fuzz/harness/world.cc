#include "fuzz/harness/world.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/model/model_config.h"
#include "kernels/formats.h"

namespace kvguard::fuzz {

using isolation::Mode;
using isolation::Owner;
using isolation::PageGrant;
using isolation::Violation;
using isolation::ViolationKind;
using kernels::PageTag;

// KVG_TRACE records one line of the action trace, formatted only when it is printed
// (KVGUARD_FUZZ_TRACE=1): fuzzing speed comes first, and a crash replays exactly with it on.
#define KVG_TRACE(...)                         \
  do {                                         \
    if (echo_) Log(absl::StrCat(__VA_ARGS__)); \
  } while (0)

namespace {

constexpr int kHeadDim = 64;
const char* const kTenantNames[] = {"alpha", "bravo", "charlie"};
constexpr Mode kTenantModes[] = {Mode::kEnforce, Mode::kStrict, Mode::kOff};
constexpr int kQuarantineAfter = 3;
constexpr int kMaxKeys = 4;

bool TagIsZero(const PageTag& t) { return (t.lo | t.hi) == 0; }
bool IsRepeatKind(ViolationKind k) {
  return k == ViolationKind::kTenantQuarantined || k == ViolationKind::kSessionQuarantined ||
         k == ViolationKind::kAuditUnavailable;
}
std::string G(const PageGrant& g) { return absl::StrCat("p", g.page, "/g", g.generation); }

}  // namespace

struct World::ShadowPage {
  enum class State : uint8_t { kFree, kOwned, kLimbo, kQuarantined };
  State state = State::kFree;
  Owner owner;
  uint64_t generation = 0;  // the table's generation for the page, as the shadow predicts it
  bool issued = false;      // some grant of this page was handed out
  uint64_t max_issued = 0;  // the highest generation ever handed out for it
  PageTag tag;              // the current grant's tag (zero unless owned)
  isolation::KeyId key = 0;
  uint64_t retire = 0;  // limbo: steps with a ticket below this may still read it
  int copies = 0;
  Owner copy_owner;
  bool scrub = false;   // limbo: to be zeroed before it is free
  bool zeroed = false;  // known to be all zero (scrubbed, nothing written since)
};

struct World::Copy {
  int request = -1;
  PageGrant grant;
  bool read = false;
};

struct World::Request {
  int index = 0;
  int tenant = 0;
  Owner owner;
  std::unique_ptr<core::SessionPages> pages;
  Phase phase = Phase::kPrefillVerify;
  bool waiting = true;  // holds no pages; its (re)prefill grants them
  int tokens = 0;       // tokens to prefill when it (re)starts
  int target = 0;       // kv_len at which it is done
  int cursor = 0;       // page index within a write or read phase
  bool cancelled = false;
  bool tainted = false;  // an injected fault hit it: violations are expected
  bool aborted = false;
  bool quarantined = false;  // (strict) its session was quarantined
  bool ever_strict = false;
  uint64_t admitted_at = 0;  // World::admitted_at
  // The step in flight (isolation/step_guard.h, as in the engine), the page table it
  // verified (the span the step holds points into it), and the shadow's ticket for its pin.
  std::optional<isolation::StepGuard::Step> step;
  std::vector<PageGrant> presented;
  Mode step_mode = Mode::kEnforce;
  uint64_t ticket = 0;
  std::map<int, PageGrant> overrides;  // injected: entries of the page table it presents
  std::vector<PageGrant> released;     // grants it gave back (for double releases)
};

World::World(const WorldOptions& options) : options_(options) {
  keys_ = std::shared_ptr<isolation::TagKeyRing>(*isolation::TagKeyRing::CreateEphemeral());
  core::ModelConfig c;
  c.name = "fuzz";  // only the KV geometry matters: one layer, one kv head of 64
  c.dim = kHeadDim;
  c.n_heads = 1;
  c.ffn_dim = kHeadDim;
  c.vocab_size = 16;
  c.max_context = 1024;
  c.n_layers = 1;
  c.n_kv_heads = 1;
  c.head_dim = kHeadDim;
  core::KvPoolOptions po;
  po.dtype = kernels::KvDtype::kFp32;
  po.page_size = options.page_size;
  po.budget_bytes = size_t(options.num_pages) * c.KvBytesPerToken(4) * size_t(options.page_size);
  po.tag_keys = keys_;
  absl::StatusOr<std::unique_ptr<core::KvPool>> pool = core::KvPool::Create(c, po);
  if (!pool.ok() || (*pool)->num_pages() != options.num_pages) {
    std::fprintf(stderr, "fuzz world: pool: %s\n", std::string(pool.status().message()).c_str());
    std::abort();
  }
  pool_ = std::move(*pool);
  sink_ = std::make_shared<isolation::MemoryAuditSink>();
  isolation::GuardOptions go;
  go.sink = sink_;
  go.policy.tenants.clear();
  for (int t = 0; t < 3; ++t) {
    go.policy.tenants.push_back({kTenantNames[t], kTenantModes[t], kQuarantineAfter});
    tenants_.push_back({kTenantModes[t], 0, false});
  }
  absl::StatusOr<std::unique_ptr<isolation::Guard>> guard =
      isolation::Guard::Create(go, &pool_->table(), keys_);
  if (!guard.ok()) std::abort();
  guard_ = std::move(*guard);
  step_guard_ = std::make_unique<isolation::StepGuard>(guard_.get());
  // Planted bugs (fuzz/README.md): each switches on one fault hook of the real code.
  struct TableBug {
    const char* name;
    bool isolation::TableFaults::*flag;
  };
  static constexpr TableBug kTableBugs[] = {
      {"no_epoch_pin", &isolation::TableFaults::ignore_epoch},
      {"no_generation_bump", &isolation::TableFaults::skip_generation_bump},
      {"release_without_owner_check", &isolation::TableFaults::release_without_owner_check},
      {"unscrubbed_reuse", &isolation::TableFaults::skip_scrub},
      {"skip_last_page_verify", &isolation::TableFaults::skip_last_grant},
      {"copy_pin_ignored", &isolation::TableFaults::ignore_copy_pins},
      {"stale_release_accepted", &isolation::TableFaults::accept_stale_release},
      // fires once per world, when another session owns a page
      {"page_granted_twice", &isolation::TableFaults::grant_owned_page},
  };
  isolation::TableFaults planted;
  bool known = options.planted.empty();
  for (const TableBug& bug : kTableBugs) {
    if (options.planted == bug.name) {
      planted.*bug.flag = true;
      known = true;
    }
  }
  if (options.planted == "no_step_reverify") {
    step_guard_->set_faults({.skip_reverify = true});
    known = true;
  }
  if (options.planted == "cancelled_continues") {
    planted_session_.cancelled_continues = true;  // every request's lifecycle carries it
    known = true;
  }
  if (!known) {
    std::fprintf(stderr, "fuzz world: unknown planted bug '%s'\n", options.planted.c_str());
    std::abort();
  }
  pool_->table().set_faults(planted);
  shadow_.resize(size_t(options.num_pages));
  for (ShadowPage& p : shadow_) p.zeroed = true;  // KvPool::Create zeroes the pool
}

World::~World() {
  // Steps end (unpinning) and pages go back before the pool (the table) goes away.
  for (auto& q : requests_) {
    if (q->step) q->step->Finish();
  }
  requests_.clear();
}

World::Request* World::Get(int r) {
  return r >= 0 && r < num_requests() ? requests_[size_t(r)].get() : nullptr;
}
const World::Request* World::Get(int r) const {
  return r >= 0 && r < num_requests() ? requests_[size_t(r)].get() : nullptr;
}
bool World::live(int r) const {
  const Request* q = Get(r);
  return q != nullptr && q->phase != Phase::kDone;
}
World::Phase World::phase(int r) const { return Get(r)->phase; }
bool World::in_step(int r) const {
  const Request* q = Get(r);
  return q != nullptr && q->step.has_value();
}
bool World::waiting(int r) const {
  const Request* q = Get(r);
  return q != nullptr && q->phase != Phase::kDone && q->waiting;
}
bool World::cancelled(int r) const {
  const Request* q = Get(r);
  return q != nullptr && q->cancelled;
}
bool World::has_copy(int r) const {
  return std::any_of(copies_.begin(), copies_.end(), [r](const Copy& c) { return c.request == r; });
}
int World::num_pages_of(int r) const {
  const Request* q = Get(r);
  return q == nullptr || !q->pages ? 0 : q->pages->num_pages();
}

core::SchedRequest World::Describe(int r) const {
  const Request& q = *Get(r);
  core::SchedRequest d;
  d.id = q.owner.session;
  d.tenant = q.owner.tenant;
  d.preempted = q.waiting && q.admitted_at > 0;
  d.held_pages = q.pages->num_pages();
  d.most_pages = q.pages->PagesFor(q.target);
  if (q.waiting) {
    d.prefill_pages = q.pages->PagesFor(q.tokens);
    d.prefill_tokens = q.tokens;
  } else if (q.phase <= Phase::kPrefillFinish) {
    d.prefill_tokens = q.tokens;  // its prefill runs as one chunk here
  } else {
    d.grow_pages = std::max(0, q.pages->PagesFor(q.pages->kv_len() + 1) - d.held_pages);
  }
  return d;
}

uint64_t World::admitted_at(int r) const {
  const Request* q = Get(r);
  return q == nullptr || q->waiting ? 0 : q->admitted_at;
}

int World::free_pages() const { return pool_->table().free_pages(); }

void World::Log(const std::string& line) { std::fprintf(stderr, "  %s\n", line.c_str()); }

void World::Fail(const char* oracle, const std::string& detail) const {
  std::fprintf(stderr, "==kvguard-fuzz== ORACLE %s: %s\n", oracle, detail.c_str());
  if (!echo_) {
    std::fprintf(stderr,
                 "==kvguard-fuzz== the actions that led here: run this input again "
                 "with KVGUARD_FUZZ_TRACE=1 (scripts/fuzz-campaign reproduce)\n");
  }
  std::fflush(stderr);
  std::abort();
}

// ---- Shadow model ------------------------------------------------------------------------

void World::OnGranted(Request& q, size_t first) {
  std::span<const PageGrant> grants = q.pages->grants();
  for (size_t i = first; i < grants.size(); ++i) {
    const PageGrant& g = grants[i];
    if (g.page < 0 || g.page >= options_.num_pages) {
      Fail("grant-while-readable", absl::StrCat("granted page ", g.page, " is outside the pool"));
    }
    ShadowPage& sp = shadow_[size_t(g.page)];
    KVG_TRACE("  granted ", G(g), " to r", q.index);
    if (sp.state == ShadowPage::State::kOwned || sp.state == ShadowPage::State::kQuarantined) {
      Fail("grant-while-readable",
           absl::StrCat("page ", g.page, " granted to session ", q.owner.session, " while session ",
                        sp.owner.session, " owns it"));
    }
    if (sp.state == ShadowPage::State::kLimbo) {
      Fail("grant-while-readable",
           absl::StrCat("page ", g.page, " granted again while ",
                        sp.copies > 0 ? "a copy" : "a step pinned before its release",
                        " may still read it"));
    }
    if (sp.issued && g.generation <= sp.max_issued) {
      Fail("generation-reused",
           absl::StrCat("page ", g.page, " granted at generation ", g.generation,
                        ", already issued up to ", sp.max_issued));
    }
    if (sp.zeroed) {
      const kernels::PagedKvView view = pool_->LayerView(0);
      const float* k = static_cast<const float*>(view.k) + g.page * view.page_stride;
      const float* v = static_cast<const float*>(view.v) + g.page * view.page_stride;
      for (int e = 0; e < kHeadDim * options_.page_size; ++e) {
        if (k[e] != 0.0f || v[e] != 0.0f) {
          Fail("unscrubbed-reuse", absl::StrCat("page ", g.page, " was released with scrub but ",
                                                "is granted again with bytes left in it"));
        }
      }
    }
    sp.state = ShadowPage::State::kOwned;
    sp.owner = q.owner;
    sp.generation = g.generation;
    sp.issued = true;
    sp.max_issued = g.generation;
    sp.tag = g.tag;
    sp.key = keys_->active_id();
    sp.scrub = false;
  }
}

bool World::ShadowReleasable(const Owner& o, const PageGrant& g) const {
  if (g.page < 0 || g.page >= options_.num_pages) return false;
  const ShadowPage& sp = shadow_[size_t(g.page)];
  return (sp.state == ShadowPage::State::kOwned || sp.state == ShadowPage::State::kQuarantined) &&
         sp.owner == o && sp.generation == g.generation && sp.tag == g.tag;
}

void World::ShadowRelease(const PageGrant& g, bool scrub) {
  ShadowPage& sp = shadow_[size_t(g.page)];
  sp.scrub = scrub || sp.state == ShadowPage::State::kQuarantined;
  sp.state = ShadowPage::State::kLimbo;
  sp.owner = Owner{};
  sp.tag = PageTag{};
  ++sp.generation;
  sp.retire = next_ticket_;
  ShadowReclaim();
}

void World::ShadowReclaim() {
  const uint64_t oldest =
      pins_.empty() ? UINT64_MAX : *std::min_element(pins_.begin(), pins_.end());
  for (ShadowPage& sp : shadow_) {
    if (sp.state != ShadowPage::State::kLimbo || oldest < sp.retire || sp.copies > 0) continue;
    if (sp.scrub) sp.zeroed = true;
    sp.scrub = false;
    sp.state = ShadowPage::State::kFree;
  }
}

std::optional<ViolationKind> World::ShadowVerify(const Request& q) const {
  for (const PageGrant& g : Presented(q)) {
    if (g.page < 0 || g.page >= options_.num_pages) return ViolationKind::kInvalidPage;
    const ShadowPage& sp = shadow_[size_t(g.page)];
    if (sp.state != ShadowPage::State::kOwned || !(sp.owner == q.owner) ||
        sp.generation != g.generation || !(sp.tag == g.tag)) {
      return ViolationKind::kStaleGeneration;  // the kind is not compared, only the verdict
    }
    if (sp.copies > 0 && !(sp.copy_owner == q.owner)) return ViolationKind::kForeignCopyInFlight;
  }
  return std::nullopt;
}

bool World::ShadowKernelCheck(const Request& q, int page_index) const {
  const PageGrant g = Presented(q)[size_t(page_index)];
  if (g.page < 0 || g.page >= options_.num_pages) return false;
  const ShadowPage& sp = shadow_[size_t(g.page)];
  const PageTag current = sp.state == ShadowPage::State::kOwned ? sp.tag : PageTag{};
  return current == g.tag && !TagIsZero(g.tag);
}

void World::ShadowQuarantine(const Request& q) {
  for (ShadowPage& sp : shadow_) {
    if (sp.state == ShadowPage::State::kOwned && sp.owner == q.owner) {
      sp.state = ShadowPage::State::kQuarantined;
    }
  }
}

void World::CheckInvariants() {
  // Cheap first: the table's counts against the shadow's, every call. The page-by-page
  // comparison (which names the page and the oracle) runs when they differ and on every 4th
  // call; the table's own accounting check, which walks every list, on every 8th. Finish runs
  // both once more at the end.
  ++checks_;
  int free = 0, limbo = 0, used = 0;
  for (const ShadowPage& sp : shadow_) {
    free += sp.state == ShadowPage::State::kFree;
    limbo += sp.state == ShadowPage::State::kLimbo;
    used += sp.state == ShadowPage::State::kOwned || sp.state == ShadowPage::State::kQuarantined;
  }
  const isolation::OwnershipTable& t = pool_->table();
  const bool counts_differ =
      t.free_pages() != free || t.limbo_pages() != limbo || t.used_pages() != used;
  if (counts_differ || checks_ % 4 == 0) {
    static constexpr const char* kStateNames[] = {"free", "owned", "limbo", "quarantined"};
    for (int p = 0; p < options_.num_pages; ++p) {
      const isolation::PageState real = t.state(p);
      const ShadowPage::State want = shadow_[size_t(p)].state;
      if (static_cast<int>(real) == static_cast<int>(want)) continue;
      if (want == ShadowPage::State::kLimbo && real == isolation::PageState::kFree) {
        Fail("freed-while-readable",
             absl::StrCat(
                 "page ", p, " is free again while ",
                 shadow_[size_t(p)].copies > 0 ? "a copy" : "a step pinned before its release",
                 " may still read it"));
      }
      Fail("accounting",
           absl::StrCat("page ", p, " is ", kStateNames[static_cast<int>(real)], " in the table, ",
                        kStateNames[static_cast<int>(want)], " in the shadow"));
    }
  }
  if (counts_differ) {
    Fail("accounting", absl::StrCat("table free/limbo/used ", t.free_pages(), "/", t.limbo_pages(),
                                    "/", t.used_pages(), ", shadow ", free, "/", limbo, "/", used));
  }
  if (checks_ % 8 == 0) {
    if (absl::Status s = t.CheckAccounting(); !s.ok()) Fail("accounting", std::string(s.message()));
  }
}

// ---- The lifecycle -----------------------------------------------------------------------

std::vector<PageGrant> World::Presented(const Request& q) const {
  std::vector<PageGrant> out(q.pages->grants().begin(), q.pages->grants().end());
  for (const auto& [i, g] : q.overrides) {
    if (size_t(i) < out.size()) out[size_t(i)] = g;
  }
  return out;
}

void World::RefreshPresented(Request& q) {
  // In flight, the step holds a span over q.presented, as the engine's kernels read the page
  // table in place: a table corrupted mid-step is what they, and the re-verification, see.
  if (!q.step) return;
  const std::vector<PageGrant> now = Presented(q);
  if (now.size() != q.presented.size()) Fail("harness", "a page table changed size mid-step");
  std::copy(now.begin(), now.end(), q.presented.begin());
}

bool World::ScrubOnRelease(Request& q) {
  const bool scrub = q.ever_strict || guard_->mode(q.owner.tenant) == Mode::kStrict;
  q.ever_strict = false;
  return scrub;
}

void World::Violated(Request& q, const Violation& v) {
  KVG_TRACE("  r", q.index, " violation ", isolation::ViolationKindName(v.kind));
  const bool expected_quarantine =
      (v.kind == ViolationKind::kTenantQuarantined && tenants_[size_t(q.tenant)].quarantined) ||
      (v.kind == ViolationKind::kSessionQuarantined && q.quarantined);
  if (!q.tainted && !expected_quarantine) {
    Fail("scheduler-violation", absl::StrCat("request ", q.index, " (no fault injected) hit ",
                                             isolation::DescribeViolation(v)));
  }
}

void World::ShadowReported(Request& q, const Violation& v) {
  // Guard::Report quarantines a strict tenant's session (and the tenant at its limit) by
  // the tenant's mode now.
  ShadowTenant& st = tenants_[size_t(q.tenant)];
  if (st.mode == Mode::kStrict && !IsRepeatKind(v.kind)) {
    q.quarantined = true;
    ShadowQuarantine(q);
    if (++st.strict_violations >= kQuarantineAfter) st.quarantined = true;
  }
}

void World::Report(Request& q, const Violation& v) {
  ShadowReported(q, v);
  guard_->Report(v, q.owner.session);
}

void World::EndShadowStep(Request& q) {
  pins_.erase(std::find(pins_.begin(), pins_.end(), q.ticket));
  ShadowReclaim();
}

void World::AbortInStep(Request& q) {
  // The step guard has reported the violation (at Begin, or at Finish for a kernel fault or a
  // failed re-verification) and unpinned; the shadow follows.
  const Violation v = *q.step->violation(0);
  q.step.reset();
  EndShadowStep(q);
  Violated(q, v);
  ShadowReported(q, v);
  q.aborted = true;
  Complete(q);
}

void World::ReleaseAll(Request& q) {
  const bool scrub = ScrubOnRelease(q);
  std::vector<int32_t> expect_refused;
  for (const PageGrant& g : q.pages->grants()) {
    if (ShadowReleasable(q.owner, g)) {
      ShadowRelease(g, scrub);
    } else {
      expect_refused.push_back(g.page);
    }
    q.released.push_back(g);
  }
  std::vector<Violation> refused = q.pages->Release(scrub);
  std::vector<int32_t> got;
  for (const Violation& v : refused) got.push_back(v.page);
  if (got != expect_refused) {
    Fail("release-outcome", absl::StrCat("request ", q.index, " released its pages: ", got.size(),
                                         " refused, the shadow expected ", expect_refused.size()));
  }
  q.overrides.clear();
  if (!q.aborted) {
    for (const Violation& v : refused) {
      Violated(q, v);
      Report(q, v);
    }
  }
}

void World::Complete(Request& q) {
  if (!q.waiting) ReleaseAll(q);
  q.waiting = true;
  q.phase = Phase::kDone;
  KVG_TRACE("  r", q.index, " done");
}

void World::BeginStep(Request& q) {
  q.presented = Presented(q);
  const isolation::StepSession session{q.owner, q.presented, q.owner.session};
  const isolation::StepKind kind = q.phase == Phase::kPrefillVerify ? isolation::StepKind::kPrefill
                                                                    : isolation::StepKind::kDecode;
  q.step.emplace(step_guard_->Begin(std::span(&session, 1), kind));
  q.ticket = next_ticket_++;
  pins_.push_back(q.ticket);
  q.step_mode = q.step->mode(0);
  if (q.step_mode != tenants_[size_t(q.tenant)].mode) {
    Fail("mode", absl::StrCat("tenant ", kTenantNames[q.tenant], " reads mode ",
                              isolation::ModeName(q.step_mode), ", set to ",
                              isolation::ModeName(tenants_[size_t(q.tenant)].mode)));
  }
  q.ever_strict = q.ever_strict || q.step_mode == Mode::kStrict;
  const std::optional<Violation>& v = q.step->violation(0);
  std::optional<ViolationKind> want;
  const ShadowTenant& st = tenants_[size_t(q.tenant)];
  if (q.step_mode == Mode::kStrict && st.quarantined) {
    want = ViolationKind::kTenantQuarantined;
  } else if (q.step_mode == Mode::kStrict && q.quarantined) {
    want = ViolationKind::kSessionQuarantined;
  } else if (q.step_mode != Mode::kOff) {
    want = ShadowVerify(q);
  }
  KVG_TRACE("r", q.index, " pin+verify (", isolation::ModeName(q.step_mode), ", ",
            q.presented.size(), " pages): ", v ? isolation::ViolationKindName(v->kind) : "ok");
  if (v && !want) {
    Fail("legit-read-rejected", absl::StrCat("verification refused request ", q.index, ": ",
                                             isolation::DescribeViolation(*v)));
  }
  if (!v && want) {
    Fail("access-let-through",
         absl::StrCat("verification passed request ", q.index, "'s page table, the shadow says ",
                      isolation::ViolationKindName(*want)));
  }
  if (v) {
    q.step->Finish();
    AbortInStep(q);
  }
}

namespace {
kernels::DecodeQuery OnePageQuery(const PageGrant& g, int tokens) {
  kernels::DecodeQuery dq;
  dq.page_table = &g.page;
  dq.expected_tags = &g.tag;
  dq.length = tokens;
  return dq;
}
}  // namespace

bool World::KernelCheck(Request& q, const PageGrant& g, int page_index, int tokens,
                        const char* access) {
  const bool pass = kernels::FirstTagFault(pool_->LayerView(0), OnePageQuery(g, tokens)) < 0;
  const bool want = ShadowKernelCheck(q, page_index);
  KVG_TRACE("r", q.index, " ", access, " ", G(g), ": ", pass ? "ok" : "tag mismatch");
  if (pass && !want) {
    Fail("access-let-through", absl::StrCat("the kernel check let request ", q.index, " ", access,
                                            " ", G(g), ", not its current page"));
  }
  if (!pass && want) {
    Fail("legit-read-rejected", absl::StrCat("the kernel check refused request ", q.index, "'s ",
                                             access, " of its own ", G(g)));
  }
  if (!pass) {
    q.step->KernelFault(0, page_index);
    q.step->Finish();
    AbortInStep(q);
  }
  return pass;
}

void World::KernelCheckAndRead(Request& q, int page_index) {
  const PageGrant g = Presented(q)[size_t(page_index)];
  const int P = options_.page_size;
  const int tokens = std::min(P, q.pages->kv_len() + 1 - page_index * P);
  if (!KernelCheck(q, g, page_index, tokens, "read")) return;
  const kernels::PagedKvView view = pool_->LayerView(0);
  const float* k = static_cast<const float*>(view.k) + g.page * view.page_stride;
  const float* vv = static_cast<const float*>(view.v) + g.page * view.page_stride;
  for (int s = 0; s < tokens; ++s) {
    const float want_session = float(q.owner.session);
    const float want_pos = float(page_index * P + s + 1);
    if (k[s] != want_session || k[P + s] != want_pos || vv[s * kHeadDim] != want_session ||
        vv[s * kHeadDim + 1] != want_pos) {
      Fail("access-let-through",
           absl::StrCat("request ", q.index, " read slot ", s, " of ", G(g), ": session ", k[s],
                        " position ", k[P + s], ", not its own"));
    }
  }
}

void World::KernelCheckAndWrite(Request& q, int position) {
  const int P = options_.page_size;
  const int page_index = position / P;
  const PageGrant g = Presented(q)[size_t(page_index)];
  if (!KernelCheck(q, g, page_index, position % P + 1, "write into")) return;
  float k[kHeadDim] = {}, v[kHeadDim] = {};
  k[0] = v[0] = float(q.owner.session);
  k[1] = v[1] = float(position + 1);
  pool_->WriteToken(0, g, position % P, k, v);
  shadow_[size_t(g.page)].zeroed = false;
}

void World::EndStep(Request& q, bool prefill) {
  q.step->Finish();
  const std::optional<Violation>& v = q.step->violation(0);
  if (q.step_mode != Mode::kOff) {
    const std::optional<ViolationKind> want = ShadowVerify(q);
    if (v && !want) {
      Fail("legit-read-rejected", absl::StrCat("post-step verification refused request ", q.index,
                                               ": ", isolation::DescribeViolation(*v)));
    }
    if (!v && want) {
      Fail("access-let-through",
           absl::StrCat("post-step verification passed request ", q.index, "; the shadow says ",
                        isolation::ViolationKindName(*want)));
    }
  }
  KVG_TRACE("r", q.index, " end step + unpin: ", v ? isolation::ViolationKindName(v->kind) : "ok");
  if (v) {
    AbortInStep(q);
    return;
  }
  q.step.reset();
  EndShadowStep(q);
  if (!prefill) {
    q.pages->set_kv_len(q.pages->kv_len() + 1);
    q.phase = Phase::kDecodeGrow;
    return;
  }
  // The end of the prefill step consumes the cancel flag, as the engine's step boundary does.
  const bool cancelled = std::exchange(q.cancelled, false);
  std::vector<int32_t> expect_refused;
  if (cancelled) {
    const bool scrub = ScrubOnRelease(q);
    for (const PageGrant& g : q.pages->grants()) {
      if (ShadowReleasable(q.owner, g)) {
        ShadowRelease(g, scrub);
      } else {
        expect_refused.push_back(g.page);
      }
      q.released.push_back(g);
    }
    std::vector<Violation> refused;
    const bool handed = q.pages->ContinueUnlessCancelled(true, scrub, &refused);
    std::vector<int32_t> got;
    for (const Violation& r : refused) got.push_back(r.page);
    if (got != expect_refused) {
      Fail("release-outcome",
           absl::StrCat("request ", q.index, "'s release after cancel: ", got.size(),
                        " releases refused, the shadow expected ", expect_refused.size()));
    }
    for (const Violation& r : refused) {
      Violated(q, r);
      Report(q, r);
    }
    if (!handed) {
      KVG_TRACE("r", q.index, " cancelled: left after its prefill");
      q.waiting = true;
      q.phase = Phase::kDone;
      return;
    }
    KVG_TRACE("r", q.index, " went on after cancel");
  }
  q.pages->set_kv_len(q.tokens);
  q.phase = Phase::kDecodeGrow;
}

// ---- Actions -----------------------------------------------------------------------------

bool World::Open(int tenant, int prompt, int gen) {
  if (num_requests() >= options_.max_requests) return false;
  tenant = std::clamp(tenant, 0, 2);
  const isolation::TenantId id = *guard_->ResolveTenant(kTenantNames[tenant]);
  const absl::Status admitted = guard_->Admit(id);
  if (admitted.ok() == tenants_[size_t(tenant)].quarantined) {
    Fail("admission",
         absl::StrCat("tenant ", kTenantNames[tenant], " admitted: ", admitted.ok(),
                      ", quarantined in the shadow: ", tenants_[size_t(tenant)].quarantined));
  }
  if (!admitted.ok()) return false;
  auto q = std::make_unique<Request>();
  q->index = num_requests();
  q->tenant = tenant;
  q->owner = Owner{id, uint64_t(q->index) + 1};
  q->pages = std::make_unique<core::SessionPages>(&pool_->table(), q->owner, options_.page_size);
  q->pages->set_faults(planted_session_);
  q->tokens = std::max(1, prompt);
  q->target = q->tokens + std::max(1, gen);
  KVG_TRACE("open r", q->index, " tenant ", kTenantNames[tenant], " prompt ", q->tokens, " target ",
            q->target);
  requests_.push_back(std::move(q));
  return true;
}

bool World::Advance(int r) {
  Request* q = Get(r);
  if (q == nullptr || q->phase == Phase::kDone) return false;
  const int P = options_.page_size;
  if (q->waiting) {
    if (q->cancelled) {
      KVG_TRACE("r", r, " cancelled while waiting");
      q->phase = Phase::kDone;
      return true;
    }
    const isolation::Mode mode = guard_->mode(q->owner.tenant);
    const absl::Status s = q->pages->GrantFor(q->tokens);
    KVG_TRACE("r", r, " admit: grant ", q->pages->PagesFor(q->tokens),
              " pages: ", s.ok() ? "ok" : std::string(s.message()));
    if (!s.ok()) {
      if (!absl::IsResourceExhausted(s)) Fail("grant", std::string(s.message()));
      return false;
    }
    q->ever_strict = q->ever_strict || mode == Mode::kStrict;
    q->waiting = false;
    q->admitted_at = ++admissions_;
    OnGranted(*q, 0);
    q->phase = Phase::kPrefillVerify;
    return true;
  }
  switch (q->phase) {
    case Phase::kPrefillVerify:
      BeginStep(*q);
      if (q->phase != Phase::kDone) {
        q->phase = Phase::kPrefillWrite;
        q->cursor = 0;
      }
      return true;
    case Phase::kPrefillWrite: {
      const int end = std::min(q->tokens, (q->cursor + 1) * P);
      for (int pos = q->cursor * P; pos < end && q->phase != Phase::kDone; ++pos) {
        KernelCheckAndWrite(*q, pos);
      }
      KVG_TRACE("r", r, " prefill wrote page ", q->cursor);
      if (q->phase == Phase::kDone) return true;
      if (++q->cursor >= q->pages->PagesFor(q->tokens)) q->phase = Phase::kPrefillFinish;
      return true;
    }
    case Phase::kPrefillFinish:
      EndStep(*q, /*prefill=*/true);
      return true;
    case Phase::kDecodeGrow: {
      if (q->cancelled || q->pages->kv_len() >= q->target) {
        KVG_TRACE("r", r, q->cancelled ? " leaves cancelled" : " finished");
        Complete(*q);
        return true;
      }
      const int before = q->pages->num_pages();
      const absl::Status s = q->pages->GrowForNextToken();
      if (!s.ok()) {
        if (!absl::IsResourceExhausted(s)) Fail("grant", std::string(s.message()));
        KVG_TRACE("r", r, " grow: pool dry");
        return false;
      }
      if (q->pages->num_pages() > before) OnGranted(*q, size_t(before));
      q->phase = Phase::kDecodeVerify;
      return true;
    }
    case Phase::kDecodeVerify:
      BeginStep(*q);
      if (q->phase != Phase::kDone) q->phase = Phase::kDecodeWrite;
      return true;
    case Phase::kDecodeWrite:
      KernelCheckAndWrite(*q, q->pages->kv_len());
      if (q->phase != Phase::kDone) {
        q->phase = Phase::kDecodeRead;
        q->cursor = 0;
      }
      return true;
    case Phase::kDecodeRead:
      KernelCheckAndRead(*q, q->cursor);
      if (q->phase != Phase::kDone && ++q->cursor >= q->pages->PagesFor(q->pages->kv_len() + 1)) {
        q->phase = Phase::kDecodeFinish;
      }
      return true;
    case Phase::kDecodeFinish:
      EndStep(*q, /*prefill=*/false);
      return true;
    case Phase::kDone:
      break;
  }
  return false;
}

bool World::Cancel(int r) {
  Request* q = Get(r);
  if (q == nullptr || q->phase == Phase::kDone || q->cancelled) return false;
  q->cancelled = true;
  KVG_TRACE("cancel r", r);
  return true;
}

bool World::Preempt(int r) {
  Request* q = Get(r);
  if (q == nullptr || q->phase != Phase::kDecodeGrow || q->waiting) return false;
  const int kv = q->pages->kv_len();
  KVG_TRACE("preempt r", r, " (", q->pages->num_pages(), " pages, ", kv, " tokens)");
  ReleaseAll(*q);
  q->waiting = true;
  q->tokens = kv;
  return true;
}

bool World::CopyStep(int r, int page_index) {
  for (size_t c = 0; c < copies_.size(); ++c) {
    Copy& copy = copies_[c];
    if (copy.request != r) continue;
    Request& q = *Get(r);
    ShadowPage& sp = shadow_[size_t(copy.grant.page)];
    if (!copy.read) {
      // The copy engine reads the page: it must still be the copier's, at the grant's
      // generation, or waiting out the copy in limbo after the copier released it.
      const bool ours =
          sp.state != ShadowPage::State::kFree &&
          ((sp.owner == q.owner && sp.generation == copy.grant.generation) ||
           (sp.state == ShadowPage::State::kLimbo && sp.generation == copy.grant.generation + 1));
      KVG_TRACE("copy r", r, " reads ", G(copy.grant));
      if (!ours) {
        Fail("grant-while-readable",
             absl::StrCat("an in-flight copy of ", G(copy.grant), " for request ", r,
                          " reads a page that has changed hands"));
      }
      copy.read = true;
      return true;
    }
    const std::optional<Violation> v = pool_->table().EndCopy(q.owner, copy.grant);
    const bool want_ok = sp.generation == copy.grant.generation && sp.owner == q.owner &&
                         sp.state != ShadowPage::State::kLimbo &&
                         sp.state != ShadowPage::State::kFree;
    if (sp.copies > 0 && sp.copy_owner == q.owner) --sp.copies;
    if (sp.copies == 0) sp.copy_owner = Owner{};
    ShadowReclaim();
    KVG_TRACE("copy r", r, " end ", G(copy.grant), ": ",
              v ? isolation::ViolationKindName(v->kind) : "ok");
    if (v.has_value() == want_ok) {
      Fail("copy-outcome", absl::StrCat("EndCopy of ", G(copy.grant), " for request ", r,
                                        (v ? " refused" : " accepted"), " against the shadow"));
    }
    copies_.erase(copies_.begin() + ptrdiff_t(c));
    return true;
  }
  Request* q = Get(r);
  if (q == nullptr || q->phase == Phase::kDone || q->waiting || q->pages->num_pages() == 0) {
    return false;
  }
  const PageGrant g = q->pages->grants()[size_t(page_index) % size_t(q->pages->num_pages())];
  const std::optional<Violation> v = pool_->table().BeginCopy(q->owner, g);
  ShadowPage& sp = shadow_[size_t(g.page)];
  const bool want_ok = sp.state == ShadowPage::State::kOwned && sp.owner == q->owner &&
                       sp.generation == g.generation && sp.tag == g.tag &&
                       (sp.copies == 0 || sp.copy_owner == q->owner);
  KVG_TRACE("copy r", r, " begin ", G(g), ": ", v ? isolation::ViolationKindName(v->kind) : "ok");
  if (v.has_value() == want_ok) {
    Fail("copy-outcome", absl::StrCat("BeginCopy of ", G(g), " for request ", r,
                                      (v ? " refused" : " accepted"), " against the shadow"));
  }
  if (v) {
    // Only a page the request no longer holds (a fault made it stale) can be refused.
    Violated(*q, *v);
    Report(*q, *v);
    return true;
  }
  ++sp.copies;
  sp.copy_owner = q->owner;
  copies_.push_back(Copy{r, g, false});
  return true;
}

bool World::RotateKey() {
  if (keys_->key_ids().size() >= size_t(kMaxKeys)) return false;
  absl::StatusOr<isolation::KeyId> id = guard_->RotateKey("fuzz");
  if (!id.ok()) Fail("key-retire", std::string(id.status().message()));
  KVG_TRACE("rotate tag key -> ", *id);
  return true;
}

bool World::RetireOldKeys() {
  bool any = false;
  for (isolation::KeyId id : keys_->key_ids()) {
    if (id == keys_->active_id()) continue;
    int held = 0;
    for (const ShadowPage& sp : shadow_) {
      held +=
          (sp.state == ShadowPage::State::kOwned || sp.state == ShadowPage::State::kQuarantined) &&
          sp.key == id;
    }
    const absl::Status s = guard_->RetireKey(id);
    KVG_TRACE("retire key ", id, " (", held,
              " pages hold it): ", s.ok() ? "ok" : std::string(s.message()));
    if (s.ok() != (held == 0)) {
      Fail("key-retire", absl::StrCat("key ", id, " retire ", s.ok() ? "accepted" : "refused",
                                      " with ", held, " held pages under it"));
    }
    any = true;
  }
  return any;
}

bool World::SetMode(int tenant, Mode mode) {
  tenant = std::clamp(tenant, 0, 2);
  const absl::Status s = guard_->SetMode(kTenantNames[tenant], mode, "fuzz");
  if (!s.ok()) Fail("mode", std::string(s.message()));
  tenants_[size_t(tenant)].mode = mode;
  KVG_TRACE("set mode ", kTenantNames[tenant], " ", isolation::ModeName(mode));
  return true;
}

bool World::Inject(Fault f, int r, uint32_t arg) {
  Request* q = Get(r);
  if (q == nullptr || q->phase == Phase::kDone) return false;
  const int n = q->waiting ? 0 : q->pages->num_pages();
  switch (f) {
    case Fault::kReleaseMidStep: {
      if (!q->step || n == 0) return false;
      const PageGrant g = q->pages->grants()[arg % uint32_t(n)];
      if (!ShadowReleasable(q->owner, g)) return false;  // already gone
      q->tainted = true;
      KVG_TRACE("FAULT release mid-step r", r, " ", G(g));
      ShadowRelease(g, false);
      if (std::optional<Violation> v = pool_->table().Release(q->owner, g, false)) {
        Fail("release-outcome", absl::StrCat("the release of request ", r, "'s current ", G(g),
                                             " was refused: ", isolation::DescribeViolation(*v)));
      }
      return true;
    }
    case Fault::kDoubleRelease: {
      if (q->released.empty()) return false;
      const PageGrant g = q->released[arg % q->released.size()];
      q->tainted = true;
      const bool want = ShadowReleasable(q->owner, g);
      if (want) ShadowRelease(g, false);
      const std::optional<Violation> v = pool_->table().Release(q->owner, g, false);
      KVG_TRACE("FAULT double release r", r, " ", G(g), ": ",
                v ? isolation::ViolationKindName(v->kind) : "accepted");
      if (v.has_value() == want) {
        Fail("release-outcome",
             absl::StrCat("a second release of ", G(g), " by request ", r,
                          v ? " was refused" : " was accepted", " against the shadow"));
      }
      if (v) Report(*q, *v);
      return true;
    }
    case Fault::kStalePageTable: {
      if (n == 0 || q->released.empty()) return false;
      const int i = int(arg % uint32_t(n));
      q->overrides[i] = q->released[(arg >> 8) % q->released.size()];
      q->tainted = true;
      RefreshPresented(*q);
      KVG_TRACE("FAULT stale page table r", r, "[", i, "] = ", G(q->overrides[i]));
      return true;
    }
    case Fault::kForgedPageTable: {
      if (n == 0) return false;
      const int i = int(arg % uint32_t(n));
      PageGrant g;
      g.page = int32_t((arg >> 4) % uint32_t(options_.num_pages + 2)) - 1;
      g.generation = (arg >> 8) % 8;
      if ((arg >> 11) & 1) {
        g.tag = PageTag{};  // zero: the tag of a page nobody owns
      } else {
        g.tag = PageTag{0x9e3779b97f4a7c15ull * (arg | 1), arg};
      }
      q->overrides[i] = g;
      q->tainted = true;
      RefreshPresented(*q);
      KVG_TRACE("FAULT forged page table r", r, "[", i, "] = ", G(g));
      return true;
    }
    case Fault::kForeignRelease: {
      for (int k = 1; k < num_requests(); ++k) {
        Request* victim = Get(int((uint32_t(r) + uint32_t(k) + arg) % uint32_t(num_requests())));
        if (victim == q || victim->phase == Phase::kDone || victim->waiting ||
            victim->pages->num_pages() == 0) {
          continue;
        }
        const PageGrant g =
            victim->pages->grants()[(arg >> 8) % uint32_t(victim->pages->num_pages())];
        q->tainted = true;
        const bool want = ShadowReleasable(q->owner, g);
        if (want) ShadowRelease(g, false);
        const std::optional<Violation> v = pool_->table().Release(q->owner, g, false);
        KVG_TRACE("FAULT r", r, " releases r", victim->index, "'s ", G(g), ": ",
                  v ? isolation::ViolationKindName(v->kind) : "accepted");
        if (v.has_value() == want) {
          Fail("release-outcome",
               absl::StrCat("request ", r, "'s release of request ", victim->index, "'s ", G(g),
                            v ? " was refused" : " was accepted", " against the shadow"));
        }
        if (v) Report(*q, *v);
        return true;
      }
      return false;
    }
    case Fault::kCancelledContinues: {
      if (q->waiting || q->phase > Phase::kPrefillFinish) return false;
      core::SessionFaults sf;
      sf.cancelled_continues = true;
      q->pages->set_faults(sf);
      q->cancelled = true;
      q->tainted = true;
      KVG_TRACE("FAULT cancelled request goes on r", r);
      return true;
    }
    case Fault::kCount:
      break;
  }
  return false;
}

void World::Finish() {
  for (int round = 0; round < 64; ++round) {
    bool any = false;
    for (int r = 0; r < num_requests(); ++r) {
      while (has_copy(r)) CopyStep(r, 0);
      if (!live(r)) continue;
      any = true;
      Cancel(r);
      for (int i = 0; i < 256 && live(r); ++i) {
        if (!Advance(r)) break;
        CheckInvariants();
      }
    }
    if (!any) break;
  }
  for (int r = 0; r < num_requests(); ++r) {
    if (live(r)) Fail("accounting", absl::StrCat("request ", r, " cannot finish"));
  }
  checks_ = 7;  // the next check is the full one
  CheckInvariants();
  const isolation::OwnershipTable& t = pool_->table();
  if (t.free_pages() != t.num_pages()) {
    Fail("accounting", absl::StrCat("every request finished, yet only ", t.free_pages(), " of ",
                                    t.num_pages(), " pages are free"));
  }
}

}  // namespace kvguard::fuzz
