// `kvguard bench gpu`: the device check's benchmark (scripts/gpu-check runs it).
//
// Every figure is judged against the device-to-device copy bandwidth measured in the same run
// (cudaMemcpyAsync of 1 GiB, counting bytes read plus bytes written, the device's memory traffic
// rate; a kernel that only reads is judged by the bytes it must read per second):
//   * paged decode attention, FP8 vs BF16 pages, Llama-3-8B-like shape (32 query heads, 8 kv
//     heads, head_dim 128, P = 16), 512 / 4096 / 16384 tokens, 1 Mi tokens per step in pages
//     shuffled over the pool: KV bytes read per second;
//   * y = W x, INT4 (group 128) vs FP8 weights, 4096 x 4096, 11008 x 4096 and 28672 x 8192, batch
//     1 and 8, rotating over copies of W that together exceed the L2 cache: weight bytes read per
//     second;
//   * the isolation on/off overhead of the device part of a decode step: one Llama-3-8B-like layer
//     (q, k, v, o, gate, up, down INT4 matmuls, FP8 attention) at batch 16 and 4096 tokens, with
//     the in-kernel tag check on vs off, runs interleaved A B A B, median of the ratios.
// Medians of repeated runs timed with CUDA events. Writes PREFIX.md and PREFIX.json.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

#if KVGUARD_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cpu/quantize.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/matmul.h"
#include "kernels/formats.h"
#endif

namespace kvguard::tools {

#if KVGUARD_HAVE_CUDA
namespace {

using kernels::KvDtype;
using kernels::PagedKvView;
using kernels::PageTag;
using kernels::WeightFormat;

// Device owns one cudaMalloc'd buffer; Check aborts the benchmark on a CUDA error (a tool, not a
// library: there is nothing to recover).
struct Device {
  explicit Device(size_t bytes) : size(bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      std::fprintf(stderr, "kvguard bench gpu: cudaMalloc(%zu) failed\n", bytes);
      std::exit(1);
    }
  }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  void* p = nullptr;
  size_t size = 0;
};

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "kvguard bench gpu: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}
void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "kvguard bench gpu: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

template <typename T, typename Alloc>
T* Upload(const std::vector<T, Alloc>& host, std::vector<std::unique_ptr<Device>>* keep) {
  keep->push_back(std::make_unique<Device>(std::max<size_t>(1, host.size() * sizeof(T))));
  Check(cudaMemcpy(keep->back()->p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
        "upload");
  return keep->back()->as<T>();
}

// TimeMs returns the median over `reps` of the milliseconds one call of `fn` takes (after a
// warm-up call), timed with events on the default stream.
template <class Fn>
double TimeMs(int reps, const Fn& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  fn();
  Check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start);
    fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  Check(cudaGetLastError(), "timed run");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string name;
  double gbps = 0;
  double ms = 0;
};

double CopyGBps(int reps) {
  const size_t bytes = size_t{1} << 30;
  Device a(bytes), b(bytes);
  Check(cudaMemset(a.p, 1, bytes), "memset");
  const double ms =
      TimeMs(reps, [&] { cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice); });
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

// AttentionStep is one decode step's queries over a pool of shuffled pages, on the device.
struct AttentionStep {
  AttentionStep(KvDtype dtype, int ctx, int batch, bool tagged) {
    constexpr int kHeads = 32, kKvHeads = 8, kDim = 128, kPage = 16;
    const size_t pages = size_t(batch) * ctx / kPage;
    const size_t esize = kernels::KvDtypeBytes(dtype);
    kv = kernels::PackedKvView(dtype, kPage, kKvHeads, kDim, nullptr, nullptr);
    const size_t bytes = pages * kv.page_stride * esize;
    buffers.push_back(std::make_unique<Device>(bytes));
    buffers.push_back(std::make_unique<Device>(bytes));
    Check(cudaMemset(buffers[0]->p, 0x31, bytes), "memset K");  // finite codes
    Check(cudaMemset(buffers[1]->p, 0x32, bytes), "memset V");
    kv.k = buffers[0]->p;
    kv.v = buffers[1]->p;
    kv.k_scale = kv.v_scale = Upload(std::vector<float>(kKvHeads, 0.01f), &buffers);
    std::vector<int32_t> ids(pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
    std::vector<int32_t> lengths(batch, ctx), offsets(batch);
    for (int r = 0; r < batch; ++r) offsets[r] = r * (ctx / kPage);
    std::vector<PageTag> tags(pages), expected(pages);
    for (size_t p = 0; p < pages; ++p) tags[p] = PageTag{p * 0x9E3779B97F4A7C15ull + 1, p + 7};
    for (size_t i = 0; i < pages; ++i) expected[i] = tags[size_t(ids[i])];
    heads = kHeads;
    b.num_queries = batch;
    b.max_length = ctx;
    b.q = Upload(std::vector<float>(size_t(batch) * kHeads * kDim, 0.05f), &buffers);
    buffers.push_back(std::make_unique<Device>(size_t(batch) * kHeads * kDim * sizeof(float)));
    b.out = buffers.back()->as<float>();
    b.lengths = Upload(lengths, &buffers);
    b.table_offsets = Upload(offsets, &buffers);
    b.page_ids = Upload(ids, &buffers);
    if (tagged) {
      kv.page_tags = Upload(tags, &buffers);
      kv.num_pages = static_cast<int32_t>(pages);
      b.expected_tags = Upload(expected, &buffers);
      buffers.push_back(std::make_unique<Device>(sizeof(int32_t) * batch));
      b.tag_faults = buffers.back()->as<int32_t>();
    }
    workspace_bytes = kernels::cuda::AttentionWorkspaceBytes(kv, heads, batch, ctx);
    buffers.push_back(std::make_unique<Device>(std::max<size_t>(1, workspace_bytes)));
    workspace = buffers.back()->p;
    kv_bytes = 2.0 * bytes;
  }
  void Run() const {
    Check(kernels::cuda::PagedDecodeAttention(kv, heads, 0.088f, b, workspace, workspace_bytes,
                                              nullptr),
          "attention");
  }
  PagedKvView kv;
  kernels::cuda::DeviceDecodeBatch b;
  int heads = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  double kv_bytes = 0;
  std::vector<std::unique_ptr<Device>> buffers;
};

// Weights holds enough device copies of one quantised matrix to exceed the L2 cache.
struct Weights {
  Weights(WeightFormat format, int rows, int cols, size_t min_total) {
    std::mt19937 rng(rows + cols);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> w(size_t(rows) * cols);
    for (float& v : w) v = normal(rng);
    const kernels::QuantizedMatrix q = kernels::QuantizeMatrix(w.data(), rows, cols, format, 128);
    bytes = kernels::WeightBytes(q.view());
    const size_t copies = std::max<size_t>(2, (min_total + bytes - 1) / bytes);
    for (size_t i = 0; i < copies; ++i) {
      kernels::WeightView v = q.view();
      v.data = Upload(q.data, &buffers);
      if (!q.row_scales.empty()) v.row_scales = Upload(q.row_scales, &buffers);
      if (!q.group_scales.empty()) v.group_scales = Upload(q.group_scales, &buffers);
      views.push_back(v);
    }
  }
  std::vector<kernels::WeightView> views;
  size_t bytes = 0;
  std::vector<std::unique_ptr<Device>> buffers;
};

int Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard bench gpu: %s\n\n", error.c_str());
  std::fprintf(stderr,
               "usage: kvguard bench gpu [--reps N] [--out PREFIX]\n"
               "  --reps N      timed runs per figure, median reported (default 20)\n"
               "  --out PREFIX  write PREFIX.md and PREFIX.json\n");
  return error.empty() ? 0 : 2;
}

}  // namespace

int RunBenchGpu(const std::vector<std::string>& args) {
  int reps = 20;
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") return Usage("");
    if (args[i] == "--reps" && i + 1 < args.size()) {
      reps = std::max(3, std::atoi(args[++i].c_str()));
    } else if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else {
      return Usage("unknown argument '" + args[i] + "'");
    }
  }
  if (kernels::cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "kvguard bench gpu: no CUDA device: %s\n",
                 kernels::cuda::NoDeviceReason().c_str());
    return 1;
  }
  const double copy = CopyGBps(reps);
  std::fprintf(stderr, "device-to-device copy: %.1f GB/s (read + write)\n", copy);
  std::vector<Row> rows;
  for (KvDtype dtype : {KvDtype::kFp8E4m3, KvDtype::kBf16}) {
    for (int ctx : {512, 4096, 16384}) {
      const AttentionStep step(dtype, ctx, (1 << 20) / ctx, /*tagged=*/true);
      const double ms = TimeMs(reps, [&] { step.Run(); });
      rows.push_back({absl::StrCat("attention/", dtype == KvDtype::kBf16 ? "bf16" : "fp8",
                                   "/ctx:", ctx, "/batch:", (1 << 20) / ctx, "/tagged"),
                      step.kv_bytes / (ms * 1e-3) / 1e9, ms});
      std::fprintf(stderr, "%s: %.1f GB/s\n", rows.back().name.c_str(), rows.back().gbps);
    }
  }
  for (WeightFormat f : {WeightFormat::kInt4, WeightFormat::kFp8}) {
    for (auto [r, c] : {std::pair{4096, 4096}, {11008, 4096}, {28672, 8192}}) {
      const Weights w(f, r, c, size_t{1} << 30);
      for (int batch : {1, 8}) {
        Device x(size_t(batch) * c * sizeof(float)), y(size_t(batch) * r * sizeof(float));
        Check(cudaMemset(x.p, 0, x.size), "memset x");
        size_t next = 0;
        const double ms = TimeMs(reps, [&] {
          Check(kernels::cuda::MatMul(w.views[next], x.as<float>(), batch, y.as<float>(), nullptr),
                "matmul");
          next = (next + 1) % w.views.size();
        });
        rows.push_back({absl::StrCat("matmul/", kernels::WeightFormatName(f), "/", r, "x", c,
                                     "/batch:", batch),
                        double(w.bytes) / (ms * 1e-3) / 1e9, ms});
        std::fprintf(stderr, "%s: %.1f GB/s\n", rows.back().name.c_str(), rows.back().gbps);
      }
    }
  }
  // Isolation on/off: the device part of one decode step of a Llama-3-8B-like layer at batch 16,
  // 4096 tokens, interleaved A B A B.
  const int batch = 16;
  const AttentionStep on(KvDtype::kFp8E4m3, 4096, batch, true),
      off(KvDtype::kFp8E4m3, 4096, batch, false);
  const std::pair<int, int> shapes[] = {{4096, 4096},  {1024, 4096},  {1024, 4096}, {4096, 4096},
                                        {14336, 4096}, {14336, 4096}, {4096, 14336}};
  std::vector<std::unique_ptr<Weights>> layer;
  for (auto [r, c] : shapes)
    layer.push_back(std::make_unique<Weights>(WeightFormat::kInt4, r, c, 0));
  Device x(size_t(batch) * 14336 * sizeof(float)), y(size_t(batch) * 14336 * sizeof(float));
  Check(cudaMemset(x.p, 0, x.size), "memset x");
  auto step = [&](const AttentionStep& attention) {
    for (const auto& w : layer) {
      Check(kernels::cuda::MatMul(w->views[0], x.as<float>(), batch, y.as<float>(), nullptr),
            "matmul");
    }
    attention.Run();
  };
  std::vector<double> ratios;
  double on_ms = 0, off_ms = 0;
  for (int round = 0; round < 7; ++round) {
    const double a = TimeMs(reps, [&] { step(off); });
    const double b = TimeMs(reps, [&] { step(on); });
    ratios.push_back(b / a);
    on_ms += b / 7;
    off_ms += a / 7;
  }
  std::sort(ratios.begin(), ratios.end());
  const double overhead = ratios[ratios.size() / 2] - 1.0;
  std::fprintf(stderr, "isolation (in-kernel tag check) on/off, one layer's device step: %+.2f%%\n",
               100 * overhead);

  const std::string when =
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone());
  std::string md =
      absl::StrCat("# GPU benchmark\n\nRecorded ", when, " by `kvguard bench gpu",
                   out.empty() ? "" : " --out " + out, "`.\n\n```\n", BuildDescription(),
                   "```\n\nDevice-to-device copy: ", copy,
                   " GB/s (bytes read + written). Kernels: bytes they must read per "
                   "second, and that over the copy figure.\n\n"
                   "| benchmark | GB/s | % of copy | ms |\n| --- | ---: | ---: | ---: |\n");
  for (const Row& r : rows) {
    char line[256];
    std::snprintf(line, sizeof(line), "| %s | %.1f | %.1f%% | %.4f |\n", r.name.c_str(), r.gbps,
                  100 * r.gbps / copy, r.ms);
    md += line;
  }
  char iso[256];
  std::snprintf(iso, sizeof(iso),
                "\nIsolation (in-kernel tag check) on/off for the device part of one decode step "
                "of a Llama-3-8B-like layer, batch %d, 4096 tokens: %+.2f%% (median of 7 "
                "interleaved rounds; %.3f ms on, %.3f ms off).\n",
                batch, 100 * overhead, on_ms, off_ms);
  md += iso;
  std::printf("%s", md.c_str());
  if (!out.empty()) {
    nlohmann::json doc;
    doc["recorded"] = when;
    doc["device"] = kernels::cuda::DeviceSummary();
    doc["copy_gbps"] = copy;
    for (const Row& r : rows)
      doc["rows"].push_back({{"name", r.name}, {"gbps", r.gbps}, {"ms", r.ms}});
    doc["isolation_overhead"] = overhead;
    std::ofstream(out + ".json") << doc.dump(2) << "\n";
    std::ofstream(out + ".md") << md;
  }
  return 0;
}

#else  // !KVGUARD_HAVE_CUDA

int RunBenchGpu(const std::vector<std::string>& /*args*/) {
  std::fprintf(stderr,
               "kvguard bench gpu: this kvguard was built without CUDA (no nvcc at configure "
               "time; see README, GPU)\n");
  return 1;
}

#endif  // KVGUARD_HAVE_CUDA

}  // namespace kvguard::tools
