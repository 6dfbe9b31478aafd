// core/text/jinja/tests.cc: the builtin tests (`x is defined`, `x is divisibleby 3`, ...).
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/text/jinja/builtin_args.h"
#include "core/text/jinja/builtins.h"
#include "core/text/jinja/pystr.h"
#include "core/text/jinja/renderer.h"
#include "core/text/jinja/status_macros.h"

namespace kvguard::core::jinja {
namespace {

absl::StatusOr<Value> OneArg(absl::string_view test, const CallArgs& args) {
  Params p(test, args, {"other"});
  JINJA_RETURN_IF_ERROR(p.status());
  if (p[0] == nullptr) return Bad(absl::StrCat("test '", test, "' needs an argument"));
  return *p[0];
}

absl::Status NoArgs(absl::string_view test, const CallArgs& args) {
  return Params(test, args, {}).status();
}

#define JINJA_SIMPLE_TEST(fn, name, expr)                              \
  absl::StatusOr<bool> fn(Renderer&, const Value& v, CallArgs& args) { \
    JINJA_RETURN_IF_ERROR(NoArgs(name, args));                         \
    return (expr);                                                     \
  }

JINJA_SIMPLE_TEST(TDefined, "defined", !v.is_undefined())
JINJA_SIMPLE_TEST(TUndefined, "undefined", v.is_undefined())
JINJA_SIMPLE_TEST(TNone, "none", v.is_none())
JINJA_SIMPLE_TEST(TBoolean, "boolean", v.kind() == Kind::kBool)
JINJA_SIMPLE_TEST(TTrue, "true", v.kind() == Kind::kBool && v.bool_value())
JINJA_SIMPLE_TEST(TFalse, "false", v.kind() == Kind::kBool && !v.bool_value())
JINJA_SIMPLE_TEST(TInteger, "integer", v.kind() == Kind::kInt)
JINJA_SIMPLE_TEST(TFloat, "float", v.kind() == Kind::kFloat)
JINJA_SIMPLE_TEST(TNumber, "number", v.is_number())
JINJA_SIMPLE_TEST(TString, "string", v.is_string())
JINJA_SIMPLE_TEST(TMapping, "mapping", v.is_dict())
JINJA_SIMPLE_TEST(TIterable, "iterable",
                  v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
JINJA_SIMPLE_TEST(TSequence, "sequence",
                  v.is_string() || (v.is_list() && !v.is_generator()) || v.is_dict() ||
                      v.is_undefined())
JINJA_SIMPLE_TEST(TCallable, "callable", v.kind() == Kind::kCallable)
JINJA_SIMPLE_TEST(TLower, "lower", v.is_string() && AsciiLower(v.str()) == v.str())
JINJA_SIMPLE_TEST(TUpper, "upper", v.is_string() && AsciiUpper(v.str()) == v.str())
#undef JINJA_SIMPLE_TEST

absl::StatusOr<bool> TOddEven(const Value& v, const CallArgs& args, bool odd) {
  JINJA_RETURN_IF_ERROR(NoArgs(odd ? "odd" : "even", args));
  if (v.kind() != Kind::kInt && v.kind() != Kind::kBool) {
    return Bad(absl::StrCat("'", odd ? "odd" : "even", "' needs an integer"));
  }
  return (v.int_value() % 2 != 0) == odd;
}
absl::StatusOr<bool> TOdd(Renderer&, const Value& v, CallArgs& args) {
  return TOddEven(v, args, true);
}
absl::StatusOr<bool> TEven(Renderer&, const Value& v, CallArgs& args) {
  return TOddEven(v, args, false);
}

absl::StatusOr<bool> TDivisibleBy(Renderer&, const Value& v, CallArgs& args) {
  JINJA_ASSIGN_OR_RETURN(Value n, OneArg("divisibleby", args));
  if (!v.is_number() || !n.is_number()) return Bad("divisibleby needs numbers");
  if (v.kind() == Kind::kFloat || n.kind() == Kind::kFloat) {
    if (n.float_value() == 0) return Bad("float modulo by zero");
    return std::fmod(v.float_value(), n.float_value()) == 0;
  }
  if (n.int_value() == 0) return Bad("integer division or modulo by zero");
  if (n.int_value() == -1) return true;
  return v.int_value() % n.int_value() == 0;
}

absl::StatusOr<bool> TEq(Renderer&, const Value& v, CallArgs& args) {
  JINJA_ASSIGN_OR_RETURN(Value other, OneArg("eq", args));
  return Equals(v, other);
}
absl::StatusOr<bool> TNe(Renderer&, const Value& v, CallArgs& args) {
  JINJA_ASSIGN_OR_RETURN(Value other, OneArg("ne", args));
  return !Equals(v, other);
}

absl::StatusOr<bool> TSameAs(Renderer&, const Value& v, CallArgs& args) {
  JINJA_ASSIGN_OR_RETURN(Value other, OneArg("sameas", args));
  // Python's `is`: the singletons None, True and False compare by identity; so do containers
  // shared by reference. Numbers and strings are left to equality of kind and value.
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Kind::kNone:
    case Kind::kUndefined:
      return true;
    case Kind::kBool:
      return v.bool_value() == other.bool_value();
    case Kind::kList:
      return &v.list() == &other.list();
    case Kind::kDict:
    case Kind::kNamespace:
      return &v.dict() == &other.dict();
    default:
      return Equals(v, other);
  }
}

absl::StatusOr<bool> Ordered(const Value& v, const CallArgs& args, absl::string_view name,
                             bool (*pick)(int)) {
  JINJA_ASSIGN_OR_RETURN(Value other, OneArg(name, args));
  JINJA_ASSIGN_OR_RETURN(int c, Compare(v, other));
  return pick(c);
}
absl::StatusOr<bool> TLt(Renderer&, const Value& v, CallArgs& args) {
  return Ordered(v, args, "lt", [](int c) { return c < 0; });
}
absl::StatusOr<bool> TLe(Renderer&, const Value& v, CallArgs& args) {
  return Ordered(v, args, "le", [](int c) { return c <= 0; });
}
absl::StatusOr<bool> TGt(Renderer&, const Value& v, CallArgs& args) {
  return Ordered(v, args, "gt", [](int c) { return c > 0; });
}
absl::StatusOr<bool> TGe(Renderer&, const Value& v, CallArgs& args) {
  return Ordered(v, args, "ge", [](int c) { return c >= 0; });
}

absl::StatusOr<bool> TIn(Renderer&, const Value& v, CallArgs& args) {
  JINJA_ASSIGN_OR_RETURN(Value seq, OneArg("in", args));
  if (seq.is_string()) return v.is_string() && seq.str().find(v.str()) != std::string::npos;
  if (seq.is_dict()) return v.is_string() && seq.dict().Find(v.str()) != nullptr;
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(seq));
  for (const Value& item : items) {
    if (Equals(item, v)) return true;
  }
  return false;
}

const absl::flat_hash_map<absl::string_view, TestFn>& Tests() {
  static const auto* tests = new absl::flat_hash_map<absl::string_view, TestFn>{
      {"defined", TDefined},
      {"undefined", TUndefined},
      {"none", TNone},
      {"boolean", TBoolean},
      {"true", TTrue},
      {"false", TFalse},
      {"integer", TInteger},
      {"float", TFloat},
      {"number", TNumber},
      {"string", TString},
      {"mapping", TMapping},
      {"iterable", TIterable},
      {"sequence", TSequence},
      {"callable", TCallable},
      {"lower", TLower},
      {"upper", TUpper},
      {"odd", TOdd},
      {"even", TEven},
      {"divisibleby", TDivisibleBy},
      {"eq", TEq},
      {"equalto", TEq},
      {"==", TEq},
      {"ne", TNe},
      {"!=", TNe},
      {"sameas", TSameAs},
      {"lt", TLt},
      {"lessthan", TLt},
      {"le", TLe},
      {"gt", TGt},
      {"greaterthan", TGt},
      {"ge", TGe},
      {"in", TIn},
  };
  return *tests;
}

}  // namespace

const TestFn* FindTest(absl::string_view name) {
  auto it = Tests().find(name);
  return it == Tests().end() ? nullptr : &it->second;
}

}  // namespace kvguard::core::jinja
