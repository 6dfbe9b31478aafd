// core/text/jinja/builtin_args.h: what the builtins (filters.cc, tests.cc, builtins.cc) share:
// Python-style argument binding and the argument and result checks.
#ifndef KVGUARD_CORE_TEXT_JINJA_BUILTIN_ARGS_H_
#define KVGUARD_CORE_TEXT_JINJA_BUILTIN_ARGS_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/text/jinja/renderer.h"
#include "core/text/jinja/status_macros.h"
#include "core/text/jinja/value.h"

namespace kvguard::core::jinja {

// Params binds a call's arguments to parameter names, Python style: positional first, then by
// keyword; extra or unknown arguments are an error.
class Params {
 public:
  Params(absl::string_view fn, const CallArgs& args, std::initializer_list<absl::string_view> names)
      : names_(names), values_(names.size(), nullptr) {
    if (args.positional.size() > names_.size()) {
      status_ = absl::InvalidArgumentError(absl::StrCat("'", fn, "' takes at most ", names_.size(),
                                                        " arguments (", args.positional.size(),
                                                        " given)"));
      return;
    }
    for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = &args.positional[i];
    for (const auto& [key, value] : args.keyword) {
      auto it = std::find(names_.begin(), names_.end(), key);
      if (it == names_.end()) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat("'", fn, "' got an unexpected keyword argument '", key, "'"));
        return;
      }
      values_[size_t(it - names_.begin())] = &value;
    }
  }
  const absl::Status& status() const { return status_; }
  const Value* operator[](size_t i) const { return values_[i]; }
  bool Has(size_t i) const { return values_[i] != nullptr && !values_[i]->is_none(); }

 private:
  std::vector<absl::string_view> names_;
  std::vector<const Value*> values_;
  absl::Status status_;
};

inline absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

inline absl::StatusOr<std::string> StrArg(const Value* v, absl::string_view fn,
                                          absl::string_view param) {
  if (v == nullptr || !v->is_string()) {
    return Bad(absl::StrCat("'", fn, "': '", param, "' must be a string"));
  }
  return v->str();
}

inline absl::StatusOr<int64_t> IntArg(const Value* v, int64_t def, absl::string_view fn,
                                      absl::string_view param) {
  if (v == nullptr || v->is_none()) return def;
  if (v->kind() != Kind::kInt && v->kind() != Kind::kBool) {
    return Bad(absl::StrCat("'", fn, "': '", param, "' must be an integer"));
  }
  return v->int_value();
}

inline absl::StatusOr<Value> StringResult(Renderer& r, std::string s) {
  JINJA_RETURN_IF_ERROR(r.CheckSize(s.size()));
  return Value::String(std::move(s));
}

// AttrPath: jinja2's attribute getter for filters (`"a.b"`, digits index lists).
absl::StatusOr<Value> AttrPath(Renderer& r, const Value& v, const std::string& path);

// SplitLines: str.splitlines() (Python's line boundaries).
std::vector<std::string> SplitLines(absl::string_view s);

}  // namespace kvguard::core::jinja

#endif  // KVGUARD_CORE_TEXT_JINJA_BUILTIN_ARGS_H_
