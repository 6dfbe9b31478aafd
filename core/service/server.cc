#include "core/service/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/service/audit_log_sink.h"
#include "core/service/openai_api.h"
#include "core/service/prometheus_text.h"

namespace kvguard::core {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Reply(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(ErrorBody(e), "application/json");
}

ApiError Error(int status, std::string type, std::string code, std::string message) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

// SubmitError maps Engine::Submit's refusals onto HTTP.
ApiError SubmitError(const absl::Status& s) {
  const std::string m(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return Error(
          400, "invalid_request_error",
          m.find("context") != std::string::npos ? "context_length_exceeded" : "invalid_value", m);
    case absl::StatusCode::kResourceExhausted:
      return Error(400, "invalid_request_error", "context_length_exceeded", m);
    case absl::StatusCode::kPermissionDenied:
      return Error(403, "permission_error", "tenant_quarantined", m);
    case absl::StatusCode::kUnavailable:
      return Error(503, "server_error", "unavailable", m);
    default:
      return Error(500, "server_error", "internal_error", m);
  }
}

// FinishReasonText maps an engine finish onto OpenAI's finish_reason (ok ones only).
const char* FinishReasonText(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

// ResultError returns the error for a request that did not finish normally, else nullopt.
std::optional<ApiError> ResultError(const absl::StatusOr<GenerationResult>& result) {
  if (!result.ok())
    return Error(500, "server_error", "internal_error", std::string(result.status().message()));
  switch (result->reason) {
    case FinishReason::kAborted: {
      ApiError e = Error(
          500, "isolation_error", "kv_integrity_violation",
          absl::StrCat("request ", result->id, " was aborted by the KV isolation layer (",
                       result->violation ? isolation::ViolationKindName(result->violation->kind)
                                         : "violation",
                       "); the audit log records it under request ", result->id));
      e.request_id = result->id;
      return e;
    }
    case FinishReason::kCancelled: {
      ApiError e = Error(503, "server_error", "request_cancelled",
                         "the request was cancelled (the server is shutting down)");
      e.request_id = result->id;
      return e;
    }
    case FinishReason::kError: {
      ApiError e =
          Error(500, "server_error", "internal_error", std::string(result->status.message()));
      e.request_id = result->id;
      return e;
    }
    default:
      return std::nullopt;
  }
}

// Stream is what a streaming request's engine callback, its waiter thread and its HTTP
// content provider share.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::string pending;  // text produced and not yet sent
  // With logprobs: generated tokens' entries not yet sent, and (echo) the prompt's, once its
  // prefill is done. echoed: the prompt's tokens (echo).
  std::vector<TokenLogprobs> logprobs;
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  std::vector<int> echoed;
  bool finished = false;
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not finished");
  std::thread waiter;  // Engine::Wait for the request; joined by the resource releaser
};

}  // namespace

struct Server::Impl {
  struct TenantState {
    int in_flight = 0;
    int pages_reserved = 0;
  };
  // Admission holds a request's share of its tenant's limits; released when destroyed.
  struct Admission {
    Impl* impl;
    std::string tenant;
    int pages;
    ~Admission() {
      std::lock_guard<std::mutex> lock(impl->mu);
      TenantState& t = impl->tenants[tenant];
      --t.in_flight;
      t.pages_reserved -= pages;
      impl->cv.notify_all();
    }
  };

  Engine* engine = nullptr;
  std::shared_ptr<const Tokenizer> tokenizer;
  ServerOptions options;
  httplib::Server api;
  httplib::Server admin;
  std::thread api_thread, admin_thread;
  int api_port = 0, admin_port = 0;
  int api_fd = -1, admin_fd = -1;  // the listening sockets (see Start)

  // Serialises the admin API's changes (reload, mode PUT, key rotation): each is validated,
  // recorded and applied before the next begins.
  std::mutex admin_mu;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<const ServiceConfig> config;  // replaced whole by reload
  absl::flat_hash_map<std::string, TenantState> tenants;
  absl::flat_hash_set<RequestId> in_flight;
  bool draining = false;
  bool stopped = false;
  // Metrics (guarded by mu).
  std::map<std::tuple<std::string, std::string, int>, int64_t> requests;  // tenant, route, code
  std::map<std::string, int64_t> outcomes;  // finish reasons and client disconnects
  int64_t prompt_tokens = 0, output_tokens = 0;
  std::deque<std::pair<int64_t, int64_t>> token_seconds;  // (steady second, tokens) last 10 s

  std::shared_ptr<const ServiceConfig> Config() const {
    std::lock_guard<std::mutex> lock(mu);
    return config;
  }

  void Count(const std::string& tenant, const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++requests[{tenant, route, status}];
  }

  void CountTokens(int prompt, int output, const std::string& outcome) {
    std::lock_guard<std::mutex> lock(mu);
    prompt_tokens += prompt;
    output_tokens += output;
    ++outcomes[outcome];
    const int64_t sec =
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count();
    if (token_seconds.empty() || token_seconds.back().first != sec) {
      token_seconds.emplace_back(sec, 0);
    }
    token_seconds.back().second += output;
    while (!token_seconds.empty() && token_seconds.front().first < sec - 10) {
      token_seconds.pop_front();
    }
  }

  // LogRequest writes one request log line; prompt text only with --log-prompts. With the
  // engine's result, also its queue time (submit to admission) and time to first token, as the
  // engine measured them (the client's own adds the HTTP path).
  void LogRequest(uint64_t id, const std::string& tenant, const std::string& route, int status,
                  int prompt_n, int output_n, const std::string& outcome, Clock::time_point start,
                  const std::string& prompt,
                  const absl::StatusOr<GenerationResult>* result = nullptr) const {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::string line =
        absl::StrCat("kvguard serve: request=", id, " tenant=", tenant, " route=", route,
                     " status=", status, " prompt_tokens=", prompt_n,
                     " completion_tokens=", output_n, " outcome=", outcome, " seconds=", seconds);
    if (result != nullptr && result->ok() && !(*result)->tokens.empty()) {
      absl::StrAppend(&line, " queue_seconds=", (*result)->queue_seconds,
                      " first_token_seconds=", (*result)->first_token_seconds);
    }
    if (options.log_prompts) absl::StrAppend(&line, " prompt=", Dump(json(prompt)));
    line += '\n';
    std::fputs(line.c_str(), stderr);
  }

  // Authenticate returns the tenant of the request's bearer key, or replies 401.
  std::optional<ServiceTenant> Authenticate(const httplib::Request& req,
                                            httplib::Response& res) const {
    const std::string header = req.get_header_value("Authorization");
    std::optional<std::string_view> key = BearerToken(header);
    std::shared_ptr<const ServiceConfig> c = Config();
    std::optional<size_t> t = key ? c->Authenticate(*key) : std::nullopt;
    if (!t) {
      Reply(res, Error(401, "invalid_request_error", "invalid_api_key",
                       key ? "incorrect API key provided"
                           : "missing API key: send \"Authorization: Bearer KEY\""));
      return std::nullopt;
    }
    return c->tenants[*t];
  }

  // HasAdminKey returns whether the request carries the admin key.
  bool HasAdminKey(const httplib::Request& req) const {
    const std::string header = req.get_header_value("Authorization");  // outlives `key`
    std::optional<std::string_view> key = BearerToken(header);
    return key && options.admin_key_digest &&
           DigestsEqual(KeyDigestOf(*key), *options.admin_key_digest);
  }

  bool AdminAuthorized(const httplib::Request& req, httplib::Response& res) const {
    if (HasAdminKey(req)) return true;
    Reply(res, Error(401, "invalid_request_error", "invalid_api_key",
                     "the admin API needs the admin key"));
    return false;
  }

  // MetricsAuthorized returns whether the request may read /metrics and /readyz's detail.
  bool MetricsAuthorized(const httplib::Request& req) const {
    return options.metrics_auth == MetricsAuth::kNone || HasAdminKey(req);
  }

  bool Ready() const {
    std::lock_guard<std::mutex> lock(mu);
    return !draining;
  }

  void HandleCompletion(const httplib::Request& req, httplib::Response& res, bool chat);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res, bool detokenize);
  // LimitsFor: what the API's parsers check a request of `tenant` against (one place for every
  // route, so /tokenize sees the model, body limit, vocabulary and chat format a completion does).
  RequestLimits LimitsFor(const ServiceTenant& tenant) const {
    RequestLimits limits;
    limits.model = options.model_name;
    limits.max_tokens = tenant.limits.tokens_per_request;
    limits.default_max_tokens = options.default_max_tokens;
    limits.max_prompt_bytes = options.max_body_bytes;
    limits.vocab_size = engine->model().config().vocab_size;
    limits.chat_format = &options.chat_format;
    return limits;
  }
  void StreamResponse(httplib::Response& res, RequestId id, CompletionRequest request,
                      std::shared_ptr<Stream> stream, std::shared_ptr<Admission> admission,
                      std::string tenant, int prompt_n, Clock::time_point start);
  void Finish(RequestId id) {
    std::lock_guard<std::mutex> lock(mu);
    in_flight.erase(id);
    cv.notify_all();
  }
  void SetupApi();
  void SetupAdmin();
  json TenantsJson() const;
  std::string RenderMetrics() const;
  absl::Status Reload(std::string* summary);
};

void Server::Impl::HandleCompletion(const httplib::Request& req, httplib::Response& res,
                                    bool chat) {
  const Clock::time_point start = Clock::now();
  const std::string route = chat ? "/v1/chat/completions" : "/v1/completions";
  std::optional<ServiceTenant> tenant = Authenticate(req, res);
  if (!tenant) return Count("", route, res.status);
  const std::string& name = tenant->name;
  auto refuse = [&](const ApiError& e) {
    Reply(res, e);
    Count(name, route, e.status);
    LogRequest(0, name, route, e.status, 0, 0, "refused:" + e.code, start, "");
  };
  {
    std::lock_guard<std::mutex> lock(mu);
    if (draining) {
      Reply(res, Error(503, "server_error", "shutting_down", "the server is shutting down"));
      ++requests[{name, route, 503}];
      return;
    }
  }
  const RequestLimits limits = LimitsFor(*tenant);
  CompletionRequest request;
  if (std::optional<ApiError> e = ParseCompletionRequest(req.body, chat, limits, &request)) {
    return refuse(*e);
  }
  std::vector<int> prompt;
  if (std::optional<ApiError> e = TokenizePrompt(*tokenizer, &request, &prompt)) return refuse(*e);
  const int prompt_n = static_cast<int>(prompt.size());
  const int page_size = engine->pool().page_size();
  const int pages = (prompt_n + request.max_tokens + page_size - 1) / page_size;

  // Admission against the tenant's limits; the reservation lives as long as the request.
  std::shared_ptr<Admission> admission;
  {
    std::lock_guard<std::mutex> lock(mu);
    TenantState& ts = tenants[name];
    const TenantLimits& l = tenant->limits;
    if (ts.in_flight >= l.concurrent_requests) {
      ApiError e = Error(429, "rate_limit_error", "concurrency_limit_exceeded",
                         absl::StrCat("tenant has ", ts.in_flight, " requests in flight (limit ",
                                      l.concurrent_requests, ")"));
      ++requests[{name, route, 429}];
      Reply(res, e);
      return;
    }
    if (l.kv_page_quota > 0 && ts.pages_reserved + pages > l.kv_page_quota) {
      ApiError e =
          Error(429, "rate_limit_error", "kv_page_quota_exceeded",
                absl::StrCat("the request needs up to ", pages, " KV pages; the tenant holds ",
                             ts.pages_reserved, " of its quota of ", l.kv_page_quota));
      if (pages > l.kv_page_quota) {
        e.status = 400;
        e.type = "invalid_request_error";
      }
      ++requests[{name, route, e.status}];
      Reply(res, e);
      return;
    }
    ++ts.in_flight;
    ts.pages_reserved += pages;
    admission = std::shared_ptr<Admission>(new Admission{this, name, pages});
  }

  GenerationRequest g;
  g.tenant = name;  // from the key, never from the body
  g.prompt = std::move(prompt);
  g.max_tokens = request.max_tokens;
  g.sampling.temperature = request.temperature;
  g.sampling.top_p = request.top_p;
  g.sampling.seed = request.seed ? *request.seed : std::random_device{}();
  g.stop = request.stop;
  g.stop_at_eos = !request.ignore_eos;
  g.logprobs = request.logprobs;
  g.prompt_logprobs = request.echo && request.logprobs >= 0;
  // echo: the prompt's text (and its tokens, for logprobs) come back first.
  const std::vector<int> echoed = request.echo ? g.prompt : std::vector<int>();
  std::shared_ptr<Stream> stream;
  if (request.stream) {
    stream = std::make_shared<Stream>();
    g.on_text = [stream](std::string_view text) {
      std::lock_guard<std::mutex> lock(stream->mu);
      stream->pending.append(text);
      stream->cv.notify_all();
    };
    if (request.logprobs >= 0) {
      g.on_logprobs = [stream](const TokenLogprobs& e) {
        std::lock_guard<std::mutex> lock(stream->mu);
        stream->logprobs.push_back(e);
      };
    }
    if (g.prompt_logprobs) {
      g.on_prompt_logprobs = [stream](std::span<const TokenLogprobs> entries) {
        std::lock_guard<std::mutex> lock(stream->mu);
        stream->prompt_logprobs.emplace(entries.begin(), entries.end());
        stream->cv.notify_all();
      };
    }
    stream->echoed = echoed;
  }
  absl::StatusOr<RequestId> id = engine->Submit(std::move(g));
  if (!id.ok()) return refuse(SubmitError(id.status()));
  {
    std::lock_guard<std::mutex> lock(mu);
    in_flight.insert(*id);
  }
  if (request.stream) {
    return StreamResponse(res, *id, std::move(request), std::move(stream), std::move(admission),
                          name, prompt_n, start);
  }
  absl::StatusOr<GenerationResult> result = engine->Wait(*id);
  Finish(*id);
  const int output_n = result.ok() ? static_cast<int>(result->tokens.size()) : 0;
  if (std::optional<ApiError> e = ResultError(result)) {
    Reply(res, *e);
    // An isolation abort is not the client's to retry blindly: the abort is the answer.
    res.set_header("x-should-retry", "false");
    Count(name, route, e->status);
    CountTokens(prompt_n, output_n, e->code);
    LogRequest(*id, name, route, e->status, prompt_n, output_n, e->code, start, request.prompt);
    return;
  }
  const char* finish = FinishReasonText(result->reason);
  const std::string rid = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", *id);
  int64_t offset = 0;
  const json logprobs = request.logprobs < 0
                            ? json(nullptr)
                            : LogprobsJson(request, *tokenizer, echoed, result->prompt_logprobs,
                                           result->logprobs, &offset);
  res.set_content(Dump(CompletionBody(request, rid, UnixSeconds(),
                                      request.echo ? request.prompt + result->text : result->text,
                                      finish, Usage{prompt_n, output_n}, logprobs)),
                  "application/json");
  Count(name, route, 200);
  CountTokens(prompt_n, output_n, finish);
  LogRequest(*id, name, route, 200, prompt_n, output_n, finish, start, request.prompt, &result);
}

void Server::Impl::StreamResponse(httplib::Response& res, RequestId id, CompletionRequest request,
                                  std::shared_ptr<Stream> stream,
                                  std::shared_ptr<Admission> admission, std::string tenant,
                                  int prompt_n, Clock::time_point start) {
  stream->waiter = std::thread([this, stream, id] {
    absl::StatusOr<GenerationResult> r = engine->Wait(id);
    std::lock_guard<std::mutex> lock(stream->mu);
    stream->result = std::move(r);
    stream->finished = true;
    stream->cv.notify_all();
  });
  const std::string rid = absl::StrCat(request.chat ? "chatcmpl-" : "cmpl-", id);
  const int64_t created = UnixSeconds();
  auto req = std::make_shared<CompletionRequest>(std::move(request));
  auto status = std::make_shared<int>(200);
  auto outcome = std::make_shared<std::string>("client_disconnected");
  res.set_header("Cache-Control", "no-cache");
  res.set_header("x-request-id", rid);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, stream, id, rid, created, req, status, outcome, prompt_n](size_t,
                                                                       httplib::DataSink& sink) {
        bool first = true;
        auto write = [&](const std::string& event) {
          if (sink.write(event.data(), event.size())) return true;
          engine->Cancel(id);  // the client is gone: release its pages now
          return false;
        };
        // Logprobs go out with the text their tokens produced: entries whose text is held back
        // (a piece of a character, a possible stop sequence) wait for the next text, or the
        // last chunk. echo: the prompt comes first (with logprobs, once its prefill is done).
        const bool with_logprobs = req->logprobs >= 0;
        bool echo_left = req->echo;
        std::vector<TokenLogprobs> unsent, prompt_logprobs;
        int64_t offset = 0;  // text_offset of the next token
        auto logprobs = [&](bool echo_now) {
          if (!with_logprobs) return json(nullptr);
          const json lp =
              LogprobsJson(*req, *tokenizer,
                           echo_now ? std::span<const int>(stream->echoed) : std::span<const int>(),
                           prompt_logprobs, unsent, &offset);
          unsent.clear();
          return lp;
        };
        std::unique_lock<std::mutex> lock(stream->mu);
        auto echo_ready = [&] { return echo_left && (!with_logprobs || stream->prompt_logprobs); };
        for (;;) {
          stream->cv.wait(
              lock, [&] { return !stream->pending.empty() || stream->finished || echo_ready(); });
          std::string text = std::move(stream->pending);
          stream->pending.clear();
          std::move(stream->logprobs.begin(), stream->logprobs.end(), std::back_inserter(unsent));
          stream->logprobs.clear();
          const bool finished = stream->finished;
          const bool echo_now = echo_ready();
          if (echo_now && with_logprobs) prompt_logprobs = *stream->prompt_logprobs;
          lock.unlock();
          if (echo_now) text = req->prompt + text, echo_left = false;
          if (!text.empty()) {
            if (!write(SseEvent(ChunkBody(*req, rid, created, text, std::nullopt, first,
                                          logprobs(echo_now))))) {
              return false;
            }
            first = false;
          }
          if (finished) break;
          lock.lock();
        }
        // Finished: the waiter has stored the result and will not touch it again.
        const absl::StatusOr<GenerationResult>& result = stream->result;
        if (std::optional<ApiError> e = ResultError(result)) {
          *status = e->status;
          *outcome = e->code;
          if (!write(SseEvent(ErrorJson(*e)))) return false;
        } else {
          const char* finish = FinishReasonText(result->reason);
          *outcome = finish;
          if (!write(SseEvent(ChunkBody(*req, rid, created, "", finish, first,
                                        unsent.empty() ? json(nullptr) : logprobs(false))))) {
            return false;
          }
          if (req->include_usage &&
              !write(SseEvent(UsageChunkBody(
                  *req, rid, created, Usage{prompt_n, static_cast<int>(result->tokens.size())})))) {
            return false;
          }
          if (!write(std::string(kSseDone))) return false;
        }
        sink.done();
        return true;
      },
      [this, stream, id, admission, tenant, prompt_n, start, req, status, outcome](bool) {
        engine->Cancel(id);  // no-op if it finished; else the connection is gone
        if (stream->waiter.joinable()) stream->waiter.join();
        Finish(id);
        const int output_n =
            stream->result.ok() ? static_cast<int>(stream->result->tokens.size()) : 0;
        const std::string route = req->chat ? "/v1/chat/completions" : "/v1/completions";
        Count(tenant, route, *status);
        CountTokens(prompt_n, output_n, *outcome);
        LogRequest(id, tenant, route, *status, prompt_n, output_n, *outcome, start, req->prompt,
                   &stream->result);
      });
}

void Server::Impl::SetupApi() {
  api.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(req, res, /*chat=*/false);
  });
  api.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(req, res, /*chat=*/true);
  });
  api.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    std::optional<ServiceTenant> tenant = Authenticate(req, res);
    if (!tenant) return Count("", "/v1/models", res.status);
    json model = {
        {"id", options.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "kvguard"}};
    res.set_content(Dump(json{{"object", "list"}, {"data", json::array({model})}}),
                    "application/json");
    Count(tenant->name, "/v1/models", 200);
  });
  api.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTokenize(req, res, /*detokenize=*/false);
  });
  api.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTokenize(req, res, /*detokenize=*/true);
  });
}

// HandleTokenize answers /tokenize, or /detokenize when `detokenize` (vLLM's shapes). Neither
// reaches the engine, so there is no admission and nothing to log beyond the route's count.
void Server::Impl::HandleTokenize(const httplib::Request& req, httplib::Response& res,
                                  bool detokenize) {
  const std::string route = detokenize ? "/detokenize" : "/tokenize";
  std::optional<ServiceTenant> tenant = Authenticate(req, res);
  if (!tenant) return Count("", route, res.status);
  const RequestLimits limits = LimitsFor(*tenant);
  std::optional<ApiError> error;
  json body;
  if (detokenize) {
    DetokenizeRequest request;
    error = ParseDetokenizeRequest(req.body, limits, &request);
    if (!error) body = DetokenizeBody(*tokenizer, request.tokens);
  } else {
    TokenizeRequest request;
    error = ParseTokenizeRequest(req.body, limits, &request);
    // The calls HandleCompletion makes (a text prompt's Encode; a chat's TokenizePrompt), so the
    // ids are the ones a completion of the same prompt or messages feeds the engine.
    std::vector<int> ids;
    if (!error && request.chat) {
      error = TokenizePrompt(*tokenizer, &request.chat_request, &ids);
    } else if (!error) {
      ids = tokenizer->Encode(request.prompt, request.add_special_tokens);
    }
    if (!error) body = TokenizeBody(request, *tokenizer, ids, engine->model().config().max_context);
  }
  if (error) {
    Reply(res, *error);
    return Count(tenant->name, route, error->status);
  }
  res.set_content(Dump(body), "application/json");
  Count(tenant->name, route, 200);
}

json Server::Impl::TenantsJson() const {
  std::shared_ptr<const ServiceConfig> c = Config();
  const isolation::GuardStats gs = engine->guard().stats();
  json out = json::array();
  std::lock_guard<std::mutex> lock(mu);
  for (const ServiceTenant& t : c->tenants) {
    absl::StatusOr<isolation::TenantId> id = engine->guard().ResolveTenant(t.name);
    int64_t violations = 0;
    for (const auto& [key, n] : gs.by_tenant_reason) {
      if (key.first == t.name) violations += n;
    }
    auto st = tenants.find(t.name);
    out.push_back({{"id", t.name},
                   {"mode", id.ok() ? isolation::ModeName(engine->guard().mode(*id)) : "?"},
                   {"api_keys", t.key_digests.size()},
                   {"limits",
                    {{"concurrent_requests", t.limits.concurrent_requests},
                     {"tokens_per_request", t.limits.tokens_per_request},
                     {"kv_page_quota", t.limits.kv_page_quota}}},
                   {"in_flight", st == tenants.end() ? 0 : st->second.in_flight},
                   {"kv_pages_reserved", st == tenants.end() ? 0 : st->second.pages_reserved},
                   {"violations", violations}});
  }
  return json{{"tenants", out}};
}

// Reload reads the tenants file again and applies it all or nothing: the file is read and
// checked whole, every change is recorded (mode_change through the guard, one config_change per
// tenant whose keys or limits changed), durably, and only then are the modes and the new config
// applied together (Guard::ApplyChanges). A record that fails applies nothing. The set of
// tenants cannot change at run time (the engine's tenant ids are fixed at start):
// FailedPrecondition, and nothing applied. Callers hold admin_mu.
absl::Status Server::Impl::Reload(std::string* summary) {
  if (options.tenants_file.empty()) {
    return absl::FailedPreconditionError("the server was started without a tenants file");
  }
  absl::StatusOr<ServiceConfig> loaded = ServiceConfig::LoadFile(options.tenants_file);
  if (!loaded.ok()) return loaded.status();
  auto next = std::make_shared<const ServiceConfig>(*std::move(loaded));
  std::shared_ptr<const ServiceConfig> current = Config();
  if (next->tenants.size() != current->tenants.size()) {
    return absl::FailedPreconditionError(
        "adding or removing tenants needs a restart (the engine's tenants are fixed at start)");
  }
  for (size_t i = 0; i < next->tenants.size(); ++i) {
    if (next->tenants[i].name != current->tenants[i].name) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tenants[", i, "] is '", next->tenants[i].name, "', was '", current->tenants[i].name,
          "': renaming, adding or removing tenants needs a restart"));
    }
  }
  std::vector<std::string> changes;
  std::vector<isolation::Guard::ModeChange> modes;
  std::vector<isolation::AuditEvent> records;
  isolation::Guard& guard = engine->guard();
  for (size_t i = 0; i < next->tenants.size(); ++i) {
    const ServiceTenant& before = current->tenants[i];
    const ServiceTenant& after = next->tenants[i];
    const isolation::Mode mode_before = guard.mode(*guard.ResolveTenant(before.name));
    const isolation::Mode mode_after = next->policy.tenants[i].mode;
    if (mode_before != mode_after) {
      modes.push_back({after.name, mode_after});
      changes.push_back(absl::StrCat(after.name, ".mode ", isolation::ModeName(mode_before), " -> ",
                                     isolation::ModeName(mode_after)));
    }
    std::vector<std::string> detail;
    auto limit = [&](const char* field, int a, int b) {
      if (a != b) detail.push_back(absl::StrCat("limits.", field, " ", a, " -> ", b));
    };
    limit("concurrent_requests", before.limits.concurrent_requests,
          after.limits.concurrent_requests);
    limit("tokens_per_request", before.limits.tokens_per_request, after.limits.tokens_per_request);
    limit("kv_page_quota", before.limits.kv_page_quota, after.limits.kv_page_quota);
    // Keys by the first 8 hex digits of their digest: enough to tell them apart in a record,
    // nothing that helps anyone guess a key.
    auto short_digests = [](const ServiceTenant& t) {
      std::vector<std::string> out;
      for (const KeyDigest& d : t.key_digests) out.push_back(DigestText(d).substr(0, 15));
      std::sort(out.begin(), out.end());
      return out;
    };
    if (short_digests(before) != short_digests(after) ||
        before.key_digests.size() != after.key_digests.size()) {
      detail.push_back(absl::StrCat("api_keys [", absl::StrJoin(short_digests(before), ","),
                                    "] -> [", absl::StrJoin(short_digests(after), ","), "]"));
    }
    if (!detail.empty()) {
      isolation::AuditEvent e;
      e.type = isolation::AuditEvent::Type::kConfigChange;
      e.tenant = after.name;
      e.mode = isolation::ModeName(mode_after);
      e.actor = "admin:reload";
      e.detail = absl::StrJoin(detail, "; ");
      changes.push_back(absl::StrCat(after.name, ": ", e.detail));
      records.push_back(std::move(e));
    }
  }
  if (absl::Status s = guard.ApplyChanges(modes, std::move(records), "admin:reload",
                                          [&] {
                                            std::lock_guard<std::mutex> lock(mu);
                                            config = next;
                                          });
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("reload not applied: ", s.message()));
  }
  *summary = changes.empty() ? "no changes" : absl::StrJoin(changes, "; ");
  return absl::OkStatus();
}

void Server::Impl::SetupAdmin() {
  admin.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!MetricsAuthorized(req)) {
      return Reply(res, Error(401, "invalid_request_error", "invalid_api_key",
                              "/metrics needs the admin key (--metrics-auth admin)"));
    }
    res.set_content(RenderMetrics(), kPrometheusContentType);
  });
  admin.Get("/admin/tenants", [this](const httplib::Request& req, httplib::Response& res) {
    if (!AdminAuthorized(req, res)) return;
    res.set_content(Dump(TenantsJson()), "application/json");
  });
  admin.Put(R"(/admin/tenants/([^/]+)/mode)", [this](const httplib::Request& req,
                                                     httplib::Response& res) {
    if (!AdminAuthorized(req, res)) return;
    const std::string tenant = req.matches[1];
    const json body = json::parse(req.body, nullptr, false);
    auto mode_field = body.is_object() ? body.find("mode") : body.end();
    if (!body.is_object() || mode_field == body.end() || !mode_field->is_string()) {
      ApiError e = Error(400, "invalid_request_error", "invalid_value",
                         "body must be {\"mode\": \"off\"|\"enforce\"|\"strict\"}");
      e.param = "mode";
      return Reply(res, e);
    }
    absl::StatusOr<isolation::Mode> mode =
        isolation::ParseMode(mode_field->get_ref<const std::string&>());
    if (!mode.ok()) {
      ApiError e = Error(400, "invalid_request_error", "invalid_value",
                         std::string(mode.status().message()));
      e.param = "mode";
      return Reply(res, e);
    }
    isolation::Guard& guard = engine->guard();
    absl::StatusOr<isolation::TenantId> id = guard.ResolveTenant(tenant);
    if (!id.ok()) {
      return Reply(res, Error(404, "invalid_request_error", "tenant_not_found",
                              std::string(id.status().message())));
    }
    std::lock_guard<std::mutex> serial(admin_mu);
    const isolation::Mode before = guard.mode(*id);
    if (absl::Status s = guard.SetMode(tenant, *mode, "admin"); !s.ok()) {
      return Reply(res, Error(503, "server_error", "audit_unavailable", std::string(s.message())));
    }
    res.set_content(Dump(json{{"id", tenant},
                              {"mode_from", isolation::ModeName(before)},
                              {"mode_to", isolation::ModeName(*mode)}}),
                    "application/json");
  });
  admin.Post("/admin/reload", [this](const httplib::Request& req, httplib::Response& res) {
    if (!AdminAuthorized(req, res)) return;
    std::string summary;
    std::lock_guard<std::mutex> serial(admin_mu);
    if (absl::Status s = Reload(&summary); !s.ok()) {
      // The file's fault (unreadable, refused, malformed, another tenant set): 409. Anything
      // else is the audit log's (a change that cannot be recorded is not applied): 503.
      const bool file =
          absl::IsFailedPrecondition(s) || absl::IsInvalidArgument(s) || absl::IsNotFound(s);
      return Reply(
          res, file
                   ? Error(409, "invalid_request_error", "reload_refused", std::string(s.message()))
                   : Error(503, "server_error", "audit_unavailable", std::string(s.message())));
    }
    res.set_content(Dump(json{{"reloaded", true}, {"changes", summary}}), "application/json");
  });
  admin.Post("/admin/rotate-tag-key", [this](const httplib::Request& req, httplib::Response& res) {
    if (!AdminAuthorized(req, res)) return;
    isolation::Guard& guard = engine->guard();
    std::lock_guard<std::mutex> serial(admin_mu);
    const isolation::KeyId before = guard.keys().active_id();
    absl::StatusOr<isolation::KeyId> id = guard.RotateKey("admin");
    if (!id.ok()) {
      return Reply(
          res, Error(503, "server_error", "rotation_refused", std::string(id.status().message())));
    }
    res.set_content(Dump(json{{"key_id_from", before}, {"key_id_to", *id}}), "application/json");
  });
#if KVGUARD_FAULT_INJECTION
  // Test builds only (kvguard-testserver): the next request of tenant T has its first KV page
  // released mid-step (EngineFaults::release_during_step), which verification must catch.
  admin.Post("/admin/test/abort-next", [this](const httplib::Request& req, httplib::Response& res) {
    if (!AdminAuthorized(req, res)) return;
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object() || !body.contains("tenant") || !body["tenant"].is_string()) {
      return Reply(res, Error(400, "invalid_request_error", "invalid_value",
                              "body must be {\"tenant\": NAME}"));
    }
    // Armed in the engine: the next request of this tenant it accepts gets the fault.
    EngineFaults f;
    f.release_during_step_next_of_tenant = body["tenant"].get<std::string>();
    engine->set_faults(f);
    res.set_content("{}", "application/json");
  });
  // Test builds only: pace the engine (Engine::Allow), so that an end-to-end test can hold
  // requests in flight for as long as it needs, whatever the machine's speed. Body:
  // {"prefill": N, "decode": N}, either or both: N >= 0 admissions (prefill) or steps that
  // decode (decode), or null for no limit.
  admin.Post("/admin/test/pace", [this](const httplib::Request& req, httplib::Response& res) {
    if (!AdminAuthorized(req, res)) return;
    const json body = json::parse(req.body, nullptr, false);
    const char* kShape =
        "body must be {\"prefill\": N, \"decode\": N} (either or both; N >= 0, or null for "
        "no limit)";
    if (!body.is_object() || body.empty()) {
      return Reply(res, Error(400, "invalid_request_error", "invalid_value", kShape));
    }
    std::vector<std::pair<EngineWork, int64_t>> pace;
    for (const auto& [key, value] : body.items()) {
      const bool known = key == "prefill" || key == "decode";
      const bool count = value.is_number_unsigned() &&
                         value.get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()};
      if (!known || !(count || value.is_null())) {
        return Reply(res, Error(400, "invalid_request_error", "invalid_value", kShape));
      }
      pace.emplace_back(key == "prefill" ? EngineWork::kAdmissions : EngineWork::kDecodeSteps,
                        value.is_null() ? kUnlimitedWork : value.get<int64_t>());
    }
    for (const auto& [worker, units] : pace) engine->Allow(worker, units);
    res.set_content("{}", "application/json");
  });
#endif
}

std::string Server::Impl::RenderMetrics() const {
  const EngineStats es = engine->stats();
  const isolation::GuardStats gs = engine->guard().stats();
  const absl::Status audit_health = engine->guard().sink().Healthy();
  const KvPool& pool = engine->pool();
  const std::string dtype = kernels::KvDtypeName(pool.dtype());
  PrometheusText p;
  std::lock_guard<std::mutex> lock(mu);
  p.Family("kvguard_requests_total", "counter",
           "HTTP requests to the API by tenant ('' = unauthenticated), route and status code.");
  for (const auto& [key, n] : requests) {
    const auto& [tenant, route, code] = key;
    p.Sample("kvguard_requests_total",
             {{"tenant", tenant}, {"route", route}, {"code", absl::StrCat(code)}}, n);
  }
  p.Family("kvguard_request_outcomes_total", "counter",
           "Completed generations by outcome (stop, length, kv_integrity_violation, "
           "request_cancelled, client_disconnected, ...).");
  for (const auto& [outcome, n] : outcomes) {
    p.Sample("kvguard_request_outcomes_total", {{"outcome", outcome}}, n);
  }
  p.One("kvguard_prompt_tokens_total", "counter", "Prompt tokens of generations.", prompt_tokens);
  p.One("kvguard_output_tokens_total", "counter", "Tokens generated.", output_tokens);
  const int64_t now_sec =
      std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count();
  int64_t recent = 0;
  for (const auto& [sec, n] : token_seconds) {
    if (sec >= now_sec - 10 && sec < now_sec) recent += n;
  }
  p.One("kvguard_output_tokens_per_second", "gauge",
        "Tokens generated per second over the last 10 complete seconds (of finished requests).",
        recent / 10.0);
  p.One("kvguard_requests_running", "gauge", "Requests in the decode batch.", es.running);
  p.One("kvguard_requests_queued", "gauge", "Requests waiting for admission or in prefill.",
        es.queued + es.prefilling);
  p.One("kvguard_preemptions_total", "counter", "Requests preempted (pool ran dry).",
        es.preemptions);
  p.Family("kvguard_kv_pages", "gauge", "KV cache pages by state and dtype.");
  p.Sample("kvguard_kv_pages", {{"state", "free"}, {"dtype", dtype}}, es.free_pages);
  p.Sample("kvguard_kv_pages", {{"state", "used"}, {"dtype", dtype}},
           es.total_pages - es.free_pages);
  p.Family("kvguard_kv_capacity_tokens", "gauge", "KV cache capacity in tokens by dtype.");
  p.Sample("kvguard_kv_capacity_tokens", {{"dtype", dtype}},
           static_cast<double>(pool.capacity_tokens()));
  p.One("kvguard_verify_steps_total", "counter",
        "Decode steps that verified page tables (prefill verification is not counted here).",
        gs.steps);
  p.One("kvguard_verify_seconds_total", "counter", "Time spent verifying page tables.",
        gs.verify_ns_total / 1e9);
  p.One("kvguard_verify_seconds_per_step", "gauge", "Mean verification time per step.",
        gs.steps > 0 ? gs.verify_ns_total / 1e9 / gs.steps : 0.0);
  p.One("kvguard_verify_step_seconds_max", "gauge", "The slowest step's verification.",
        gs.verify_ns_max / 1e9);
  p.Family("kvguard_violations_total", "counter", "Isolation violations by tenant and reason.");
  for (const auto& [key, n] : gs.by_tenant_reason) {
    p.Sample("kvguard_violations_total", {{"tenant", key.first}, {"reason", key.second}}, n);
  }
  p.One("kvguard_audit_log_healthy", "gauge", "1 if the audit log can record now, else 0.",
        audit_health.ok() ? 1 : 0);
  p.One("kvguard_audit_unrecorded_total", "counter", "Violations the audit log failed to record.",
        gs.unrecorded);
  p.Family("kvguard_tenant_in_flight", "gauge", "Requests in flight by tenant.");
  for (const auto& [tenant, st] : tenants) {
    p.Sample("kvguard_tenant_in_flight", {{"tenant", tenant}}, st.in_flight);
  }
  p.Family("kvguard_tenant_kv_pages_reserved", "gauge",
           "KV pages reserved against each tenant's quota.");
  for (const auto& [tenant, st] : tenants) {
    p.Sample("kvguard_tenant_kv_pages_reserved", {{"tenant", tenant}}, st.pages_reserved);
  }
  p.Family("kvguard_draining", "gauge", "1 while shutting down.");
  p.Sample("kvguard_draining", {}, draining ? 1 : 0);
  return p.text();
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Shutdown(std::chrono::milliseconds(0)); }

absl::StatusOr<std::unique_ptr<Server>> Server::Create(Engine* engine,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       ServiceConfig config,
                                                       ServerOptions options) {
  const std::vector<isolation::TenantSettings> engine_tenants = engine->guard().tenants();
  if (engine_tenants.size() != config.tenants.size()) {
    return absl::InvalidArgumentError("the service config and the engine's tenants differ");
  }
  for (size_t i = 0; i < engine_tenants.size(); ++i) {
    if (engine_tenants[i].name != config.tenants[i].name) {
      return absl::InvalidArgumentError("the service config and the engine's tenants differ");
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->engine = engine;
  impl->tokenizer = std::move(tokenizer);
  impl->options = std::move(options);
  impl->options.metrics_auth =
      ResolveMetricsAuth(impl->options.metrics_auth, impl->options.admin_host);
  impl->config = std::make_shared<const ServiceConfig>(std::move(config));
  for (const ServiceTenant& t : impl->config->tenants) impl->tenants[t.name];
  // (Not a structured binding: clang 14 cannot capture one in the lambda below.)
  for (const std::pair<httplib::Server*, int*>& entry :
       {std::pair{&impl->api, &impl->api_fd}, std::pair{&impl->admin, &impl->admin_fd}}) {
    httplib::Server* s = entry.first;
    int* fd = entry.second;
    // httplib 0.11 listens with a backlog of 5: a burst of clients overflows it. Remember the
    // listening socket here (called once, before bind) so that Start can raise the backlog.
    s->set_socket_options([fd](socket_t sock) {
      httplib::default_socket_options(sock);
      *fd = sock;
    });
    const int threads = impl->options.http_threads;
    s->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    s->set_payload_max_length(impl->options.max_body_bytes);
    s->set_read_timeout(std::chrono::milliseconds(impl->options.read_timeout_ms));
    s->set_write_timeout(std::chrono::milliseconds(impl->options.write_timeout_ms));
    s->set_keep_alive_timeout(2);
    // Every status httplib produces itself (404, 413, 400 for a broken request line) gets an
    // OpenAI error body too; handlers that set a body keep theirs.
    s->set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string code = "invalid_request";
      std::string message = absl::StrCat("HTTP ", res.status);
      if (res.status == 404) code = "not_found", message = "no such route";
      if (res.status == 413) {
        code = "request_too_large", message = "the request body is over the size limit";
      }
      if (res.status == 405) code = "method_not_allowed", message = "method not allowed";
      res.set_content(
          ErrorBody(Error(res.status, res.status >= 500 ? "server_error" : "invalid_request_error",
                          code, message)),
          "application/json");
    });
    s->set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          Reply(res, Error(500, "server_error", "internal_error", "internal error"));
        });
    Impl* raw = impl.get();
    s->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    s->set_pre_routing_handler([raw](const httplib::Request& req, httplib::Response& res) {
      std::optional<std::string> over = CheckHeaders(req.headers, raw->options.header_limits);
      if (!over) return httplib::Server::HandlerResponse::Unhandled;
      Reply(res, Error(431, "invalid_request_error", "request_header_fields_too_large", *over));
      res.set_header("Connection", "close");  // the body (if any) was never read
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  // The API's /readyz says ready or not and nothing else: the audit log's error text names
  // files, which is the operator's business (the admin listener's /readyz, and stderr).
  impl->api.Get("/readyz", [raw = impl.get()](const httplib::Request&, httplib::Response& res) {
    const bool ready = raw->Ready();
    res.status = ready ? 200 : 503;
    res.set_content(Dump(json{{"ready", ready}}), "application/json");
  });
  impl->admin.Get("/readyz",
                  [raw = impl.get()](const httplib::Request& req, httplib::Response& res) {
                    const bool ready = raw->Ready();
                    res.status = ready ? 200 : 503;
                    json body = {{"ready", ready}};
                    if (raw->MetricsAuthorized(req)) {
                      const absl::Status audit = raw->engine->guard().sink().Healthy();
                      body["draining"] = !ready;
                      body["audit_log"] = audit.ok() ? "ok" : std::string(audit.message());
                    }
                    res.set_content(Dump(body), "application/json");
                  });
  impl->SetupApi();
  impl->SetupAdmin();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

absl::Status Server::Start() {
  Impl& m = *impl_;
  auto bind = [](httplib::Server& s, const std::string& host, int port, int* bound) {
    *bound = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
    if (*bound <= 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = bind(m.api, m.options.host, m.options.port, &m.api_port); !s.ok()) {
    return s;
  }
  if (absl::Status s = bind(m.admin, m.options.admin_host, m.options.admin_port, &m.admin_port);
      !s.ok()) {
    m.api.stop();
    return s;
  }
  // listen() again on a listening socket sets its backlog (Linux).
  for (int fd : {m.api_fd, m.admin_fd}) {
    if (fd >= 0) ::listen(fd, SOMAXCONN);
  }
  // httplib 0.11's stop() does nothing until listen_after_bind has begun, and then the
  // listener runs on and Shutdown's join never returns (a SIGTERM right after start hung the
  // server). So Start returns once both loops are running, or have already returned.
  auto returned = std::make_shared<std::atomic<int>>(0);
  m.api_thread = std::thread([&m, returned] {
    m.api.listen_after_bind();
    ++*returned;
  });
  m.admin_thread = std::thread([&m, returned] {
    m.admin.listen_after_bind();
    ++*returned;
  });
  while (!(m.api.is_running() && m.admin.is_running()) && returned->load() == 0) {
    std::this_thread::yield();
  }
  return absl::OkStatus();
}

int Server::port() const { return impl_->api_port; }
int Server::admin_port() const { return impl_->admin_port; }
std::string Server::Metrics() const { return impl_->RenderMetrics(); }

void Server::Shutdown(std::chrono::milliseconds deadline) {
  Impl& m = *impl_;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    if (m.stopped) return;
    m.stopped = true;
    m.draining = true;
    m.cv.wait_for(lock, deadline, [&m] { return m.in_flight.empty(); });
    for (RequestId id : m.in_flight) m.engine->Cancel(id);
    // Cancelled requests finish at the engine's next step; their handlers then reply.
    m.cv.wait_for(lock, std::chrono::seconds(30), [&m] { return m.in_flight.empty(); });
  }
  m.api.stop();
  m.admin.stop();
  if (m.api_thread.joinable()) m.api_thread.join();
  if (m.admin_thread.joinable()) m.admin_thread.join();
  if (auto* sink = dynamic_cast<AuditLogSink*>(&m.engine->guard().sink())) {
    if (absl::Status s = sink->log().Flush(); !s.ok()) {
      std::fprintf(stderr, "kvguard serve: audit log flush failed: %s\n",
                   std::string(s.message()).c_str());
    }
  }
}

}  // namespace kvguard::core
