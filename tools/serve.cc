// `kvguard serve`: the OpenAI-compatible multi-tenant service (core/service/server.h) over the
// engine, until SIGTERM or SIGINT; then a graceful shutdown (drain, cancel after the deadline,
// flush the audit log).
#include <openssl/rand.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "audit/private_file.h"
#include "core/model/gguf_weight_source.h"
#include "core/runtime.h"
#include "core/service/chat_format.h"
#include "core/service/server.h"
#include "core/service/service_config.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

int ServeUsage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard serve: %s\n\n", error.c_str());
  std::fprintf(
      stderr,
      "usage: kvguard serve --tenants PATH | --demo-tenants PATH [options] [engine]\n"
      "  --tenants PATH               tenant config (JSON: name, mode, api_keys as\n"
      "                               sha256 digests, limits; core/service/service_config.h)\n"
      "  --demo-tenants PATH          use PATH; if absent, create it with two demo\n"
      "                               tenants (demo-a enforce, demo-b strict) and an\n"
      "                               admin key, printing the keys this one time\n"
      "  --host H / --port P          API listener (default 127.0.0.1:8080; 0 = any)\n"
      "  --admin-host H / --admin-port P  admin listener (default 127.0.0.1:8081)\n"
      "  --admin-key-file PATH        the admin key's digest (\"sha256:<hex>\")\n"
      "  --model-name NAME            the model id clients use (default: --model,\n"
      "                               or a GGUF file's name without .gguf)\n"
      "  --max-body-bytes N           request body limit (default 1M)\n"
      "  --read-timeout-ms MS / --write-timeout-ms MS  slow-client limits (10000)\n"
      "  --http-threads N             connections served at once (default 128)\n"
      "  --default-max-tokens N       when a request names none (default 16)\n"
      "  --shutdown-deadline-ms MS    on SIGTERM, in-flight requests get this long\n"
      "                               before they are cancelled (default 10000)\n"
      "  --log-prompts                put prompt text in request log lines (off)\n"
      "  --metrics-auth admin|none    whether the admin listener's /metrics (and\n"
      "                               /readyz detail) need the admin key (default:\n"
      "                               admin unless --admin-host is loopback)\n"
      "  --max-header-count N         header lines per request (default 100; more: 431)\n"
      "  --max-header-bytes N         header bytes per request (default 32K; more: 431)\n"
      "  --chat-template FILE         the chat template for /v1/chat/completions (Jinja,\n"
      "                               at most 1 MiB), instead of a GGUF model's own\n"
      "                               tokenizer.chat_template; any model (default: the\n"
      "                               model's, else \"role: content\" lines)\n"
      "%s",
      kEngineFlagsHelp);
  return error.empty() ? 0 : 2;
}

std::string RandomKey(const char* prefix) {
  unsigned char bytes[24];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return "";
  return absl::StrCat(prefix, absl::BytesToHexString(
                                  std::string(reinterpret_cast<const char*>(bytes), sizeof bytes)));
}

// CreateDemoTenants writes a tenants file with two tenants (one strict) and an admin key
// digest file beside it, and prints the keys: they are stored nowhere else.
absl::Status CreateDemoTenants(const std::string& path, const std::string& admin_key_file) {
  const std::string a = RandomKey("kvg-a-"), b = RandomKey("kvg-b-"),
                    admin = RandomKey("kvg-admin-");
  if (a.empty() || b.empty() || admin.empty()) return absl::InternalError("RAND_bytes failed");
  const std::string config = absl::StrCat(
      "{\"tenants\": [\n"
      "  {\"name\": \"demo-a\", \"mode\": \"enforce\", \"api_keys\": [\"",
      core::DigestText(core::KeyDigestOf(a)),
      "\"],\n   \"limits\": {\"concurrent_requests\": 32, \"tokens_per_request\": 1024}},\n"
      "  {\"name\": \"demo-b\", \"mode\": \"strict\", \"quarantine_after\": 3, \"api_keys\": [\"",
      core::DigestText(core::KeyDigestOf(b)),
      "\"],\n   \"limits\": {\"concurrent_requests\": 32, \"tokens_per_request\": 1024}}\n]}\n");
  if (absl::Status s = audit::WriteNewPrivateFile(path, config); !s.ok()) return s;
  if (absl::Status s = audit::WriteNewPrivateFile(
          admin_key_file, core::DigestText(core::KeyDigestOf(admin)) + "\n");
      !s.ok()) {
    return s;
  }
  std::printf(
      "Created %s with two demo tenants. Their API keys are shown this once (only SHA-256\n"
      "digests are stored):\n  demo-a (enforce): %s\n  demo-b (strict):  %s\n"
      "  admin key:        %s   (export KVGUARD_ADMIN_KEY=... for `kvguard tenant`)\n",
      path.c_str(), a.c_str(), b.c_str(), admin.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

// ReadAdminKeyDigest returns the digest in the admin key file: whoever can write it holds the
// admin API, so it gets the key files' checks (audit::ReadPrivateFile).
absl::StatusOr<core::KeyDigest> ReadAdminKeyDigest(const std::string& path) {
  absl::StatusOr<std::string> text = audit::ReadPrivateFile("admin key file", path, 4096);
  if (!text.ok()) return text.status();
  std::string digest = *std::move(text);
  while (!digest.empty() && (digest.back() == '\n' || digest.back() == ' ')) digest.pop_back();
  absl::StatusOr<core::KeyDigest> d = core::ParseDigestText(digest);
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", d.status().message()));
  return d;
}

}  // namespace

int RunServe(const std::vector<std::string>& argv) {
  core::RuntimeOptions options;
  core::ServerOptions so;
  std::string demo_tenants, admin_key_file, chat_template_file;
  int shutdown_deadline_ms = 10000;
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    std::string v;
    if (a.Flag("--help") || a.Flag("-h")) {
      return ServeUsage("");
    } else if (ParseEngineFlag(a, &options, &s)) {
    } else if (a.Flag("--demo-tenants")) {
      s = a.Value(&demo_tenants);
    } else if (a.Flag("--host")) {
      s = a.Value(&so.host);
    } else if (a.Flag("--port")) {
      s = a.Int(&so.port, 0, 65535);
    } else if (a.Flag("--admin-host")) {
      s = a.Value(&so.admin_host);
    } else if (a.Flag("--admin-port")) {
      s = a.Int(&so.admin_port, 0, 65535);
    } else if (a.Flag("--admin-key-file")) {
      s = a.Value(&admin_key_file);
    } else if (a.Flag("--model-name")) {
      s = a.Value(&so.model_name);
    } else if (a.Flag("--max-body-bytes")) {
      s = a.Value(&v);
      if (s.ok()) {
        absl::StatusOr<size_t> b = core::ParseBytes(v);
        s = b.status();
        if (b.ok()) so.max_body_bytes = *b;
      }
    } else if (a.Flag("--read-timeout-ms")) {
      s = a.Int(&so.read_timeout_ms, 1, 3600000);
    } else if (a.Flag("--write-timeout-ms")) {
      s = a.Int(&so.write_timeout_ms, 1, 3600000);
    } else if (a.Flag("--http-threads")) {
      s = a.Int(&so.http_threads, 1, 4096);
    } else if (a.Flag("--default-max-tokens")) {
      s = a.Int(&so.default_max_tokens, 1, 1 << 20);
    } else if (a.Flag("--shutdown-deadline-ms")) {
      s = a.Int(&shutdown_deadline_ms, 0, 3600000);
    } else if (a.Flag("--log-prompts")) {
      so.log_prompts = true;
    } else if (a.Flag("--metrics-auth")) {
      s = a.Value(&v);
      std::optional<core::MetricsAuth> auth = core::ParseMetricsAuth(v);
      if (s.ok() && !auth) s = absl::InvalidArgumentError("--metrics-auth: admin or none");
      if (auth) so.metrics_auth = *auth;
    } else if (a.Flag("--chat-template")) {
      s = a.Value(&chat_template_file);
    } else if (a.Flag("--max-header-count")) {
      int n = 0;
      s = a.Int(&n, 1, 10000);
      if (s.ok()) so.header_limits.max_count = static_cast<size_t>(n);
    } else if (a.Flag("--max-header-bytes")) {
      s = a.Value(&v);
      if (s.ok()) {
        absl::StatusOr<size_t> b = core::ParseBytes(v);
        s = b.status();
        if (b.ok()) so.header_limits.max_bytes = *b;
      }
    } else {
      return ServeUsage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return ServeUsage(std::string(s.message()));
  }
  if (!demo_tenants.empty()) {
    if (!options.tenants_file.empty()) return ServeUsage("--tenants and --demo-tenants conflict");
    if (admin_key_file.empty()) admin_key_file = demo_tenants + ".admin-key";
    struct stat st;
    if (stat(demo_tenants.c_str(), &st) != 0) {
      if (absl::Status s = CreateDemoTenants(demo_tenants, admin_key_file); !s.ok()) {
        std::fprintf(stderr, "kvguard serve: %s\n", std::string(s.message()).c_str());
        return 1;
      }
    } else {
      std::printf("Using the demo tenants in %s (their keys were printed when it was created).\n",
                  demo_tenants.c_str());
    }
    options.tenants_file = demo_tenants;
  }
  if (options.tenants_file.empty()) return ServeUsage("--tenants PATH is required");
  if (options.isolation_mode) return ServeUsage("--isolation: set modes in the tenants file");
  if (so.model_name.empty()) {
    // A GGUF path's clients name the model by its file name without .gguf, not the path.
    so.model_name = options.model;
    if (core::IsGgufPath(so.model_name)) {
      so.model_name = so.model_name.substr(so.model_name.rfind('/') + 1);
      so.model_name.resize(so.model_name.size() - 5);
    }
  }

  // The chat template is parsed once, here: one that does not parse stops the start.
  absl::StatusOr<core::ChatFormat> chat_format =
      core::LoadChatFormat(options.model, chat_template_file);
  if (!chat_format.ok()) {
    std::fprintf(stderr, "kvguard serve: %s\n",
                 std::string(chat_format.status().message()).c_str());
    return 1;
  }
  so.chat_format = *std::move(chat_format);

  // The tenants file is the service's (api keys, limits): the engine gets its isolation part.
  absl::StatusOr<core::ServiceConfig> config = core::ServiceConfig::LoadFile(options.tenants_file);
  if (!config.ok()) {
    std::fprintf(stderr, "kvguard serve: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  so.tenants_file = options.tenants_file;
  options.tenants_file.clear();
  options.engine.isolation.policy = config->policy;
  if (admin_key_file.empty()) {
    std::fprintf(stderr, "kvguard serve: no --admin-key-file: every admin API call is refused\n");
  } else {
    absl::StatusOr<core::KeyDigest> d = ReadAdminKeyDigest(admin_key_file);
    if (!d.ok()) {
      std::fprintf(stderr, "kvguard serve: %s\n", std::string(d.status().message()).c_str());
      return 1;
    }
    so.admin_key_digest = *d;
  }

  // SIGTERM and SIGINT are taken by sigwait below: block them before any thread starts, so
  // every thread inherits the mask and none is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a vanished client is a failed write, not a dead server

  absl::StatusOr<core::Loaded> loaded = core::LoadModel(options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvguard serve: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<core::Engine>> engine = core::MakeEngine(*loaded, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "kvguard serve: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<core::Server>> server =
      core::Server::Create(engine->get(), loaded->tokenizer, *std::move(config), so);
  if (!server.ok()) {
    std::fprintf(stderr, "kvguard serve: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = (*server)->Start(); !s.ok()) {
    std::fprintf(stderr, "kvguard serve: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const core::KvPool& pool = (*engine)->pool();
  std::printf(
      "kvguard serve: model %s (%s prefill weights on %s, %s decode weights, %s KV: %lld "
      "tokens), listening on http://%s:%d, admin on http://%s:%d\n",
      so.model_name.c_str(), kernels::WeightFormatName(options.weights.prefill_weights),
      PrefillArithmetic(options.weights), kernels::WeightFormatName(options.weights.decode_weights),
      kernels::KvDtypeName(pool.dtype()), static_cast<long long>(pool.capacity_tokens()),
      so.host.c_str(), (*server)->port(), so.admin_host.c_str(), (*server)->admin_port());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "kvguard serve: %s: draining (deadline %d ms)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", shutdown_deadline_ms);
  (*server)->Shutdown(std::chrono::milliseconds(shutdown_deadline_ms));
  server->reset();
  engine->reset();  // closes the audit log: service_stop, final checkpoint
  std::fprintf(stderr, "kvguard serve: stopped\n");
  return 0;
}

}  // namespace kvguard::tools
