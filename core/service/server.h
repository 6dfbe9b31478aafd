// core/service/server.h: `kvguard serve`: the OpenAI-compatible HTTP API (cpp-httplib) over one
// engine, with tenants, auth, limits, metrics and an admin API.
//
// Two listeners:
//   * the API (ServerOptions::host:port): POST /v1/completions, POST /v1/chat/completions,
//     GET /v1/models, GET /healthz, GET /readyz ({"ready": true|false} and nothing else: no
//     error text, no path). Every /v1 request needs "Authorization:
//     Bearer KEY"; the key alone decides the tenant (ServiceConfig::Authenticate), and the
//     engine request carries that tenant's name: nothing in a body can choose another
//     tenant's identity, session (the engine numbers sessions) or cache namespace.
//   * the admin API (admin_host:admin_port, 127.0.0.1 by default), with its own key:
//     GET /admin/tenants, PUT /admin/tenants/{id}/mode, POST /admin/reload,
//     POST /admin/rotate-tag-key; and GET /metrics (Prometheus text), /healthz, /readyz, which
//     need the admin key unless ServerOptions::metrics_auth resolves to kNone (/readyz without
//     it answers as the API's does; with it, it adds the audit log's state and error text).
//     Every change is written to the audit log with before and after.
// On both, a request with more header lines or bytes than ServerOptions::header_limits gets
// 431 before any handler runs.
// A request the isolation layer aborts gets, on its own connection, a 500 with code
// kv_integrity_violation and the engine request id (= `request` in the audit record); the
// others go on. Bad input gets a 4xx OpenAI error body; a client that vanishes mid-stream has
// its engine request cancelled, so its KV pages are released (and counted in /metrics).
#ifndef KVGUARD_CORE_SERVICE_SERVER_H_
#define KVGUARD_CORE_SERVICE_SERVER_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/engine/engine.h"
#include "core/service/http_policy.h"
#include "core/service/openai_api.h"
#include "core/service/service_config.h"
#include "core/text/tokenizer.h"

namespace kvguard::core {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() says which)
  std::string admin_host = "127.0.0.1";
  int admin_port = 8081;                      // 0: any free port
  std::optional<KeyDigest> admin_key_digest;  // unset: admin endpoints refuse every call
  std::string model_name;                     // the id /v1/models lists and requests name
  std::string tenants_file;                   // what POST /admin/reload reads again
  size_t max_body_bytes = size_t{1} << 20;    // larger bodies get 413
  int read_timeout_ms = 10000;   // a client that sends nothing for this long is dropped
  int write_timeout_ms = 10000;  // a client that reads nothing for this long is dropped
  int http_threads = 128;        // connections served at once (per listener)
  int default_max_tokens = 16;   // when a request names none (OpenAI's completions default)
  bool log_prompts = false;      // request log lines (stderr) carry no prompt text unless set
  // Who may read the admin listener's GET /metrics and /readyz detail (http_policy.h); kAuto:
  // the admin key unless admin_host is loopback.
  MetricsAuth metrics_auth = MetricsAuth::kAuto;
  HeaderLimits header_limits;  // both listeners; a request over them gets 431
  ChatFormat chat_format;      // how chat messages become the prompt (chat_format.h)
};

class Server {
 public:
  // Create checks `config` against the engine's tenant policy (the same tenants, same order).
  static absl::StatusOr<std::unique_ptr<Server>> Create(Engine* engine,
                                                        std::shared_ptr<const Tokenizer> tokenizer,
                                                        ServiceConfig config,
                                                        ServerOptions options);
  ~Server();  // Shutdown(0) if still running

  // Start binds both listeners and serves them on background threads. Unavailable (with the
  // address) if a port cannot be bound.
  absl::Status Start();
  int port() const;
  int admin_port() const;

  // Shutdown drains: from now on new requests get 503 and /readyz fails; requests in flight get
  // up to `deadline` to finish, then are cancelled; then both listeners stop and the audit log
  // is flushed. Idempotent.
  void Shutdown(std::chrono::milliseconds deadline);

  // Metrics returns the Prometheus text /metrics serves.
  std::string Metrics() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_SERVICE_SERVER_H_
