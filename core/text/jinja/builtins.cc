// core/text/jinja/builtins.cc: str and dict methods, the globals, and the helpers the
// filters and tests share.
#include "core/text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/text/jinja/builtin_args.h"
#include "core/text/jinja/pystr.h"
#include "core/text/jinja/renderer.h"
#include "core/text/jinja/status_macros.h"

namespace kvguard::core::jinja {

absl::StatusOr<Value> AttrPath(Renderer& r, const Value& v, const std::string& path) {
  Value cur = v;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    int64_t index;
    if (absl::SimpleAtoi(part, &index) && cur.is_list()) {
      const int64_t n = int64_t(cur.list().size());
      if (index < 0) index += n;
      cur = index >= 0 && index < n ? cur.list()[size_t(index)]
                                    : Value::Undefined("list index out of range");
      continue;
    }
    if (cur.is_dict() || cur.kind() == Kind::kNamespace) {
      const Value* found = cur.dict().Find(part);
      if (found != nullptr) {
        cur = *found;
        continue;
      }
    }
    // Attr refuses to look inside an Undefined, as jinja2's getitem does.
    JINJA_ASSIGN_OR_RETURN(cur, r.Attr(cur, std::string(part)));
  }
  return cur;
}

// SplitLines: str.splitlines() (Python's line boundaries).
std::vector<std::string> SplitLines(absl::string_view s) {
  std::vector<std::string> lines;
  const std::vector<char32_t> cps = CodePoints(s);
  std::string cur;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool boundary = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                          c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!boundary) {
      AppendUtf8(c, &cur);
      continue;
    }
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    lines.push_back(std::move(cur));
    cur.clear();
  }
  if (!cur.empty()) lines.push_back(std::move(cur));
  return lines;
}

namespace {

// ---- methods ----

absl::StatusOr<Value> StrMethod(Renderer& r, const std::string& s, const std::string& name,
                                CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p(name, args, {"chars"});
    JINJA_RETURN_IF_ERROR(p.status());
    std::string chars;
    if (p.Has(0)) {
      JINJA_ASSIGN_OR_RETURN(chars, StrArg(p[0], name, "chars"));
    }
    return Value::String(
        PyStrip(s, p.Has(0) ? &chars : nullptr, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    Params p(name, args, {"sep", "maxsplit"});
    JINJA_RETURN_IF_ERROR(p.status());
    std::string sep;
    if (p.Has(0)) {
      JINJA_ASSIGN_OR_RETURN(sep, StrArg(p[0], name, "sep"));
      if (sep.empty()) return Bad("split: empty separator");
    }
    JINJA_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(p[1], -1, name, "maxsplit"));
    std::vector<std::string> parts = PySplit(s, p.Has(0) ? &sep : nullptr, maxsplit);
    JINJA_RETURN_IF_ERROR(r.CheckSize(parts.size()));
    std::vector<Value> out;
    for (std::string& part : parts) out.push_back(Value::String(std::move(part)));
    return Value::List(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    Params p(name, args, {"prefix"});
    JINJA_RETURN_IF_ERROR(p.status());
    std::vector<Value> options;
    if (p[0] != nullptr && p[0]->is_list() && p[0]->is_tuple()) {
      options = p[0]->list();
    } else if (p[0] != nullptr) {
      options.push_back(*p[0]);
    }
    if (options.empty()) return Bad(absl::StrCat(name, ": needs a string or tuple of strings"));
    for (const Value& o : options) {
      JINJA_ASSIGN_OR_RETURN(std::string x, StrArg(&o, name, "prefix"));
      const bool hit = name == "startswith" ? s.compare(0, x.size(), x) == 0
                                            : s.size() >= x.size() &&
                                                  s.compare(s.size() - x.size(), x.size(), x) == 0;
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    JINJA_RETURN_IF_ERROR(Params(name, args, {}).status());
    return Value::String(name == "upper"   ? AsciiUpper(s)
                         : name == "lower" ? AsciiLower(s)
                         : name == "title" ? PyTitle(s)
                                           : PyCapitalize(s));
  }
  if (name == "replace") {
    Params p(name, args, {"old", "new", "count"});
    JINJA_RETURN_IF_ERROR(p.status());
    JINJA_ASSIGN_OR_RETURN(std::string from, StrArg(p[0], name, "old"));
    JINJA_ASSIGN_OR_RETURN(std::string to, StrArg(p[1], name, "new"));
    JINJA_ASSIGN_OR_RETURN(int64_t count, IntArg(p[2], -1, name, "count"));
    const size_t matches = from.empty() ? CodePointCount(s) + 1 : s.size() / from.size();
    if (to.size() > from.size()) {
      JINJA_RETURN_IF_ERROR(r.CheckSize(s.size() + matches * (to.size() - from.size())));
    }
    return Value::String(PyReplace(s, from, to, count));
  }
  if (name == "find" || name == "count") {
    Params p(name, args, {"sub"});
    JINJA_RETURN_IF_ERROR(p.status());
    JINJA_ASSIGN_OR_RETURN(std::string sub, StrArg(p[0], name, "sub"));
    if (name == "find") {
      const size_t at = s.find(sub);
      if (at == std::string::npos) return Value::Int(-1);
      return Value::Int(int64_t(CodePointCount(absl::string_view(s).substr(0, at))));
    }
    if (sub.empty()) return Value::Int(int64_t(CodePointCount(s)) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value::Int(n);
  }
  if (name == "join") {
    Params p(name, args, {"iterable"});
    JINJA_RETURN_IF_ERROR(p.status());
    if (p[0] == nullptr) return Bad("join: needs an iterable");
    JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*p[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) return Bad("join: sequence items must be strings");
      if (i) out += s;
      out += items[i].str();
      JINJA_RETURN_IF_ERROR(r.CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "splitlines") {
    JINJA_RETURN_IF_ERROR(Params(name, args, {}).status());
    std::vector<Value> out;
    for (std::string& line : SplitLines(s)) out.push_back(Value::String(std::move(line)));
    return Value::List(std::move(out));
  }
  return Bad(absl::StrCat("str has no method '", name, "'"));
}

absl::StatusOr<Value> DictMethod(Renderer&, const Value& d, const std::string& name,
                                 CallArgs& args) {
  if (name == "get") {
    Params p(name, args, {"key", "default"});
    JINJA_RETURN_IF_ERROR(p.status());
    if (p[0] == nullptr) return Bad("get: needs a key");
    const Value* found = p[0]->is_string() ? d.dict().Find(p[0]->str()) : nullptr;
    if (found != nullptr) return *found;
    return p[1] != nullptr ? *p[1] : Value::None();
  }
  JINJA_RETURN_IF_ERROR(Params(name, args, {}).status());
  if (name == "items") {
    std::vector<Value> out;
    for (const auto& [k, v] : d.dict().items) {
      out.push_back(Value::List({Value::String(k), v}, /*tuple=*/true));
    }
    return Value::List(std::move(out));
  }
  std::vector<Value> out;
  for (const auto& [k, v] : d.dict().items) out.push_back(name == "keys" ? Value::String(k) : v);
  return Value::List(std::move(out));
}

// ---- globals ----

absl::StatusOr<Value> GRange(Renderer& r, CallArgs& args) {
  if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
    return Bad("range takes 1 to 3 integer arguments");
  }
  int64_t v[3];
  for (size_t i = 0; i < args.positional.size(); ++i) {
    JINJA_ASSIGN_OR_RETURN(v[i], IntArg(&args.positional[i], 0, "range", "argument"));
  }
  int64_t start = 0, stop, step = 1;
  if (args.positional.size() == 1) {
    stop = v[0];
  } else {
    start = v[0];
    stop = v[1];
    if (args.positional.size() == 3) step = v[2];
  }
  if (step == 0) return Bad("range: step must not be zero");
  const double count = std::ceil((double(stop) - double(start)) / double(step));
  const size_t n = count > 0 ? size_t(std::min(count, 1e18)) : 0;
  // A range is iterated right away: the loop limit bounds it as well as the size limit.
  if (int64_t(std::min<size_t>(n, INT64_MAX)) > r.limits().max_loop_iterations) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "range of ", n, " items passes the loop limit (", r.limits().max_loop_iterations, ")"));
  }
  JINJA_RETURN_IF_ERROR(r.CheckSize(n));
  std::vector<Value> out;
  for (size_t i = 0; i < n; ++i) out.push_back(Value::Int(start + int64_t(i) * step));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> GNamespace(Renderer&, CallArgs& args) {
  Dict d;
  for (const Value& v : args.positional) {
    if (!v.is_dict()) return Bad("namespace: positional arguments must be mappings");
    for (const auto& [k, x] : v.dict().items) d.Set(k, x);
  }
  for (const auto& [k, v] : args.keyword) d.Set(k, v);
  return Value::Namespace(std::move(d));
}

absl::StatusOr<Value> GDict(Renderer&, CallArgs& args) {
  Dict d;
  for (const Value& v : args.positional) {
    if (!v.is_dict()) return Bad("dict: positional arguments must be mappings");
    for (const auto& [k, x] : v.dict().items) d.Set(k, x);
  }
  for (const auto& [k, v] : args.keyword) d.Set(k, v);
  return Value::MakeDict(std::move(d));
}

absl::StatusOr<Value> GRaise(Renderer&, CallArgs& args) {
  Params p("raise_exception", args, {"message"});
  JINJA_RETURN_IF_ERROR(p.status());
  return absl::InvalidArgumentError(
      absl::StrCat("template raised an error: ", p[0] != nullptr ? ToStr(*p[0]) : ""));
}

absl::StatusOr<Value> GStrftimeNow(Renderer&, CallArgs& args) {
  Params p("strftime_now", args, {"format"});
  JINJA_RETURN_IF_ERROR(p.status());
  JINJA_ASSIGN_OR_RETURN(std::string format, StrArg(p[0], "strftime_now", "format"));
  if (format.size() > 256) return Bad("strftime_now: format longer than 256 bytes");
  const std::time_t now = std::time(nullptr);
  std::tm tm;
  localtime_r(&now, &tm);
  if (format.empty()) return Value::String("");
  std::string buf(format.size() * 32 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
  if (n == 0) return Bad("strftime_now: the formatted time is empty or too long");
  buf.resize(n);
  if (!IsValidUtf8(buf)) return Bad("strftime_now: the formatted time is not UTF-8");
  return Value::String(std::move(buf));
}

}  // namespace

Value BoundMethod(const Value& obj, const std::string& name) {
  static constexpr absl::string_view kStr[] = {
      "strip", "lstrip",     "rstrip",  "split", "startswith", "endswith", "upper",     "lower",
      "title", "capitalize", "replace", "find",  "count",      "join",     "splitlines"};
  static constexpr absl::string_view kDict[] = {"get", "items", "keys", "values"};
  if (obj.is_string() && std::find(std::begin(kStr), std::end(kStr), name) != std::end(kStr)) {
    return Value::Function("str." + name, [obj, name](Renderer& r, CallArgs& args) {
      return StrMethod(r, obj.str(), name, args);
    });
  }
  if (obj.is_dict() && std::find(std::begin(kDict), std::end(kDict), name) != std::end(kDict)) {
    return Value::Function("dict." + name, [obj, name](Renderer& r, CallArgs& args) {
      return DictMethod(r, obj, name, args);
    });
  }
  return Value::Undefined("");
}

std::vector<std::pair<std::string, Value>> Globals() {
  return {
      {"range", Value::Function("range", GRange)},
      {"namespace", Value::Function("namespace", GNamespace)},
      {"dict", Value::Function("dict", GDict)},
      {"raise_exception", Value::Function("raise_exception", GRaise)},
      {"strftime_now", Value::Function("strftime_now", GStrftimeNow)},
  };
}

}  // namespace kvguard::core::jinja
