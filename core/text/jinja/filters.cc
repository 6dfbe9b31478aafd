// core/text/jinja/filters.cc: the builtin filters (jinja2's, with HuggingFace's tojson).
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

absl::StatusOr<Value> FTojson(Renderer& r, const Value& v, CallArgs& args) {
  Params p("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JINJA_RETURN_IF_ERROR(p.status());
  if (p.Has(0) && p[0]->Truthy()) return Bad("tojson: ensure_ascii=True is not supported");
  JsonFormat f;
  JINJA_ASSIGN_OR_RETURN(int64_t indent, IntArg(p[1], -1, "tojson", "indent"));
  if (indent > 64) return Bad("tojson: indent above 64");
  f.indent = indent < 0 ? -1 : int(indent);
  if (p.Has(2)) {
    if (!p[2]->is_list() || p[2]->list().size() != 2 || !p[2]->list()[0].is_string() ||
        !p[2]->list()[1].is_string()) {
      return Bad("tojson: separators must be two strings");
    }
    f.item_separator = p[2]->list()[0].str();
    f.key_separator = p[2]->list()[1].str();
    // An empty separator must stay empty, not fall back to the default.
    if (f.item_separator.empty() || f.key_separator.empty()) {
      return Bad("tojson: empty separators are not supported");
    }
  }
  f.sort_keys = p.Has(3) && p[3]->Truthy();
  JINJA_ASSIGN_OR_RETURN(std::string text, ToJsonText(v, f, r.limits().max_output_bytes));
  return StringResult(r, std::move(text));
}

absl::StatusOr<Value> FLength(Renderer&, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("length", args, {}).status());
  switch (v.kind()) {
    case Kind::kUndefined:
      return Value::Int(0);
    case Kind::kString:
      return Value::Int(int64_t(CodePointCount(v.str())));
    case Kind::kList:
      if (v.is_generator()) break;
      return Value::Int(int64_t(v.list().size()));
    case Kind::kDict:
      return Value::Int(int64_t(v.dict().items.size()));
    default:
      break;
  }
  return Bad(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
}

absl::StatusOr<Value> FTrim(Renderer& r, const Value& v, CallArgs& args) {
  Params p("trim", args, {"chars"});
  JINJA_RETURN_IF_ERROR(p.status());
  std::string chars;
  if (p.Has(0)) {
    JINJA_ASSIGN_OR_RETURN(chars, StrArg(p[0], "trim", "chars"));
  }
  return StringResult(r, PyStrip(ToStr(v), p.Has(0) ? &chars : nullptr, true, true));
}

absl::StatusOr<Value> FItems(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("items", args, {}).status());
  if (v.is_undefined()) return Value::List({});
  if (!v.is_dict()) return Bad("items: can only get item pairs from a mapping");
  JINJA_RETURN_IF_ERROR(r.CheckSize(v.dict().items.size()));
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict().items) {
    out.push_back(Value::List({Value::String(k), val}, /*tuple=*/true));
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> FString(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("string", args, {}).status());
  if (v.is_string()) return v;
  return StringResult(r, ToStr(v));
}

absl::StatusOr<Value> FLower(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("lower", args, {}).status());
  return StringResult(r, AsciiLower(ToStr(v)));
}

absl::StatusOr<Value> FUpper(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("upper", args, {}).status());
  return StringResult(r, AsciiUpper(ToStr(v)));
}

absl::StatusOr<Value> FCapitalize(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("capitalize", args, {}).status());
  return StringResult(r, PyCapitalize(ToStr(v)));
}

// jinja2's title: words start after runs of whitespace, '-', '(', '{', '[' or '<'; each word's
// first character upper case, the rest lower case.
absl::StatusOr<Value> FTitle(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("title", args, {}).status());
  const std::vector<char32_t> cps = CodePoints(ToStr(v));
  std::string out;
  bool word_start = true;
  for (char32_t c : cps) {
    const bool sep = IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    char32_t m = c;
    if (!sep) {
      if (word_start && c >= 'a' && c <= 'z') m = c - 'a' + 'A';
      if (!word_start && c >= 'A' && c <= 'Z') m = c - 'A' + 'a';
    }
    word_start = sep;
    AppendUtf8(m, &out);
  }
  return StringResult(r, std::move(out));
}

absl::StatusOr<Value> FJoin(Renderer& r, const Value& v, CallArgs& args) {
  Params p("join", args, {"d", "attribute"});
  JINJA_RETURN_IF_ERROR(p.status());
  // jinja2 joins with str(d), whatever d is.
  const std::string sep = p[0] != nullptr ? ToStr(*p[0]) : "";
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    Value item = items[i];
    if (p.Has(1)) {
      JINJA_ASSIGN_OR_RETURN(std::string attr, StrArg(p[1], "join", "attribute"));
      JINJA_ASSIGN_OR_RETURN(item, AttrPath(r, item, attr));
    }
    out += ToStr(item);
    JINJA_RETURN_IF_ERROR(r.CheckSize(out.size()));
  }
  return StringResult(r, std::move(out));
}

absl::StatusOr<Value> FList(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("list", args, {}).status());
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  JINJA_RETURN_IF_ERROR(r.CheckSize(items.size()));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> FSafe(Renderer&, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("safe", args, {}).status());
  if (v.is_markup()) return v;
  return Value::Markup(ToStr(v));
}

// Select: select/reject/selectattr/rejectattr. `attr`: look at that attribute of each item;
// `keep`: whether an item passing the test stays.
absl::StatusOr<Value> Select(Renderer& r, const Value& v, CallArgs& args, bool attr, bool keep,
                             absl::string_view fn) {
  // jinja2 yields nothing for a false input (None included) without iterating it.
  if (!v.Truthy()) return Value::Generator({});
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (!args.keyword.empty()) return Bad(absl::StrCat("'", fn, "' takes no keyword arguments"));
  size_t next = 0;
  std::string path;
  if (attr) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return Bad(absl::StrCat("'", fn, "' needs an attribute name"));
    }
    path = args.positional[0].str();
    next = 1;
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) {
      return Bad(absl::StrCat("'", fn, "': the test must be named by a string"));
    }
    test = args.positional[next].str();
    ++next;
  }
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + long(next), args.positional.end());
  std::vector<Value> out;
  for (const Value& item : items) {
    JINJA_RETURN_IF_ERROR(r.Charge(1));
    Value subject = item;
    if (attr) {
      JINJA_ASSIGN_OR_RETURN(subject, AttrPath(r, item, path));
    }
    bool pass;
    if (test.empty()) {
      pass = subject.Truthy();
    } else {
      CallArgs a = test_args;
      JINJA_ASSIGN_OR_RETURN(pass, r.ApplyTest(test, subject, a));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> FSelect(Renderer& r, const Value& v, CallArgs& args) {
  return Select(r, v, args, false, true, "select");
}
absl::StatusOr<Value> FReject(Renderer& r, const Value& v, CallArgs& args) {
  return Select(r, v, args, false, false, "reject");
}
absl::StatusOr<Value> FSelectattr(Renderer& r, const Value& v, CallArgs& args) {
  return Select(r, v, args, true, true, "selectattr");
}
absl::StatusOr<Value> FRejectattr(Renderer& r, const Value& v, CallArgs& args) {
  return Select(r, v, args, true, false, "rejectattr");
}

absl::StatusOr<Value> FIndent(Renderer& r, const Value& v, CallArgs& args) {
  Params p("indent", args, {"width", "first", "blank"});
  JINJA_RETURN_IF_ERROR(p.status());
  std::string indention = "    ";
  if (p.Has(0)) {
    if (p[0]->is_string()) {
      indention = p[0]->str();
    } else {
      JINJA_ASSIGN_OR_RETURN(int64_t width, IntArg(p[0], 4, "indent", "width"));
      if (width > 1024) return Bad("indent: width above 1024");
      indention.assign(size_t(std::max<int64_t>(0, width)), ' ');
    }
  }
  const bool first = p.Has(1) && p[1]->Truthy();
  const bool blank = p.Has(2) && p[2]->Truthy();
  // jinja2 appends a newline first, so a trailing newline survives splitlines().
  const std::vector<std::string> lines = SplitLines(ToStr(v) + "\n");
  JINJA_RETURN_IF_ERROR(r.CheckSize(lines.size() * (indention.size() + 1)));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
  }
  if (first) out = indention + out;
  return StringResult(r, std::move(out));
}

absl::StatusOr<Value> FReplace(Renderer& r, const Value& v, CallArgs& args) {
  Params p("replace", args, {"old", "new", "count"});
  JINJA_RETURN_IF_ERROR(p.status());
  JINJA_ASSIGN_OR_RETURN(std::string from, StrArg(p[0], "replace", "old"));
  JINJA_ASSIGN_OR_RETURN(std::string to, StrArg(p[1], "replace", "new"));
  JINJA_ASSIGN_OR_RETURN(int64_t count, IntArg(p[2], -1, "replace", "count"));
  const std::string s = ToStr(v);
  // Bound the result before building it: every match can add to.size() bytes.
  const size_t matches = from.empty() ? CodePointCount(s) + 1 : s.size() / from.size();
  if (to.size() > from.size()) {
    JINJA_RETURN_IF_ERROR(r.CheckSize(s.size() + matches * (to.size() - from.size())));
  }
  return StringResult(r, PyReplace(s, from, to, count));
}

absl::StatusOr<Value> FMap(Renderer& r, const Value& v, CallArgs& args) {
  if (!v.Truthy()) return Value::Generator({});  // as Select
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* def = nullptr;
  for (const auto& [key, value] : args.keyword) {
    if (key == "attribute") {
      attribute = &value;
    } else if (key == "default") {
      def = &value;
    } else if (attribute == nullptr) {
      return Bad(absl::StrCat("map: unexpected keyword argument '", key, "'"));
    }
  }
  if (attribute != nullptr) {
    if (!attribute->is_string() || !args.positional.empty()) {
      return Bad("map: attribute= must be a string, with no other arguments");
    }
    for (const Value& item : items) {
      JINJA_RETURN_IF_ERROR(r.Charge(1));
      JINJA_ASSIGN_OR_RETURN(Value got, AttrPath(r, item, attribute->str()));
      if (got.is_undefined() && def != nullptr) got = *def;
      out.push_back(std::move(got));
    }
    return Value::Generator(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return Bad("map: needs a filter name or attribute=");
  }
  const std::string filter = args.positional[0].str();
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    CallArgs a = rest;
    JINJA_ASSIGN_OR_RETURN(Value got, r.ApplyFilter(filter, item, a));
    out.push_back(std::move(got));
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> FUnique(Renderer& r, const Value& v, CallArgs& args) {
  Params p("unique", args, {"case_sensitive", "attribute"});
  JINJA_RETURN_IF_ERROR(p.status());
  const bool case_sensitive = p.Has(0) && p[0]->Truthy();
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::vector<Value> out, seen;
  for (const Value& item : items) {
    JINJA_RETURN_IF_ERROR(r.Charge(int64_t(seen.size() / 16 + 1)));
    Value key = item;
    if (p.Has(1)) {
      JINJA_ASSIGN_OR_RETURN(std::string attr, StrArg(p[1], "unique", "attribute"));
      JINJA_ASSIGN_OR_RETURN(key, AttrPath(r, item, attr));
    }
    // unique keeps a set of what it saw: dicts and lists are unhashable in Python.
    if (key.is_dict() || key.kind() == Kind::kNamespace || (key.is_list() && !key.is_tuple())) {
      return Bad(absl::StrCat("unique: unhashable type: '", key.TypeName(), "'"));
    }
    if (!case_sensitive && key.is_string()) key = Value::String(AsciiLower(key.str()));
    bool dup = false;
    for (const Value& s : seen) dup = dup || Equals(s, key);
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> FDefault(Renderer&, const Value& v, CallArgs& args) {
  Params p("default", args, {"default_value", "boolean"});
  JINJA_RETURN_IF_ERROR(p.status());
  const bool boolean = p.Has(1) && p[1]->Truthy();
  if (v.is_undefined() || (boolean && !v.Truthy())) {
    return p[0] != nullptr ? *p[0] : Value::String("");
  }
  return v;
}

absl::StatusOr<Value> FFirst(Renderer&, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("first", args, {}).status());
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> FLast(Renderer&, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("last", args, {}).status());
  if (v.is_generator()) return Bad("last: 'generator' object is not reversible");
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

absl::StatusOr<Value> FInt(Renderer&, const Value& v, CallArgs& args) {
  Params p("int", args, {"default", "base"});
  JINJA_RETURN_IF_ERROR(p.status());
  const Value def = p[0] != nullptr ? *p[0] : Value::Int(0);
  if (v.kind() == Kind::kInt || v.kind() == Kind::kBool) return Value::Int(v.int_value());
  if (v.kind() == Kind::kFloat) {
    const double f = std::trunc(v.float_value());
    if (!std::isfinite(f) || std::fabs(f) > 9.2e18) return def;
    return Value::Int(int64_t(f));
  }
  if (v.is_string()) {
    const std::string s = PyStrip(v.str(), nullptr, true, true);
    int64_t i;
    if (absl::SimpleAtoi(s, &i)) return Value::Int(i);
    double d;
    if (absl::SimpleAtod(s, &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::Int(int64_t(std::trunc(d)));
    }
  }
  return def;
}

absl::StatusOr<Value> FFloat(Renderer&, const Value& v, CallArgs& args) {
  Params p("float", args, {"default"});
  JINJA_RETURN_IF_ERROR(p.status());
  if (v.is_number()) return Value::Float(v.float_value());
  double d;
  if (v.is_string() && absl::SimpleAtod(PyStrip(v.str(), nullptr, true, true), &d)) {
    return Value::Float(d);
  }
  return p[0] != nullptr ? *p[0] : Value::Float(0.0);
}

absl::StatusOr<Value> FAbs(Renderer&, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("abs", args, {}).status());
  if (v.kind() == Kind::kFloat) return Value::Float(std::fabs(v.float_value()));
  if (v.is_number()) {
    if (v.int_value() == INT64_MIN) return Bad("integer overflow");
    return Value::Int(v.int_value() < 0 ? -v.int_value() : v.int_value());
  }
  return Bad(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
}

// SortKey compares two items for dictsort/sort: strings case-folded unless case_sensitive.
absl::StatusOr<int> SortCompare(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string()) {
    return Compare(Value::String(AsciiLower(a.str())), Value::String(AsciiLower(b.str())));
  }
  return Compare(a, b);
}

absl::StatusOr<std::vector<Value>> SortValues(Renderer& r, std::vector<Value> items,
                                              const std::function<Value(const Value&)>& key,
                                              bool case_sensitive, bool reverse) {
  JINJA_RETURN_IF_ERROR(r.Charge(int64_t(items.size()) * 8));
  absl::Status error;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    if (!error.ok()) return false;
    absl::StatusOr<int> c = SortCompare(key(a), key(b), case_sensitive);
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  if (!error.ok()) return error;
  return items;
}

absl::StatusOr<Value> FDictsort(Renderer& r, const Value& v, CallArgs& args) {
  Params p("dictsort", args, {"case_sensitive", "by", "reverse"});
  JINJA_RETURN_IF_ERROR(p.status());
  if (!v.is_dict()) return Bad("dictsort: can only sort a mapping");
  int pos = 0;
  if (p.Has(1)) {
    JINJA_ASSIGN_OR_RETURN(std::string by, StrArg(p[1], "dictsort", "by"));
    if (by == "value") {
      pos = 1;
    } else if (by != "key") {
      return Bad("dictsort: 'by' must be 'key' or 'value'");
    }
  }
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict().items) {
    items.push_back(Value::List({Value::String(k), val}, true));
  }
  JINJA_ASSIGN_OR_RETURN(
      items, SortValues(
                 r, std::move(items), [pos](const Value& x) { return x.list()[size_t(pos)]; },
                 p.Has(0) && p[0]->Truthy(), p.Has(2) && p[2]->Truthy()));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> FSort(Renderer& r, const Value& v, CallArgs& args) {
  Params p("sort", args, {"reverse", "case_sensitive", "attribute"});
  JINJA_RETURN_IF_ERROR(p.status());
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::string attr;
  if (p.Has(2)) {
    JINJA_ASSIGN_OR_RETURN(attr, StrArg(p[2], "sort", "attribute"));
  }
  std::vector<Value> keyed;
  for (const Value& item : items) {
    Value key = item;
    if (!attr.empty()) {
      JINJA_ASSIGN_OR_RETURN(key, AttrPath(r, item, attr));
    }
    keyed.push_back(Value::List({key, item}, true));
  }
  JINJA_ASSIGN_OR_RETURN(keyed, SortValues(
                                    r, std::move(keyed), [](const Value& x) { return x.list()[0]; },
                                    p.Has(1) && p[1]->Truthy(), p.Has(0) && p[0]->Truthy()));
  std::vector<Value> out;
  for (const Value& k : keyed) out.push_back(k.list()[1]);
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FReverse(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("reverse", args, {}).status());
  if (v.is_string()) {
    std::vector<char32_t> cps = CodePoints(v.str());
    std::reverse(cps.begin(), cps.end());
    return StringResult(r, EncodeUtf8(cps, 0, cps.size()));
  }
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::reverse(items.begin(), items.end());
  // reversed(list) is an iterator; a generator is reversed through a list.
  return v.is_list() && !v.is_generator() ? Value::Generator(std::move(items))
                                          : Value::List(std::move(items));
}

absl::StatusOr<Value> FEscape(Renderer& r, const Value& v, CallArgs& args) {
  JINJA_RETURN_IF_ERROR(Params("escape", args, {}).status());
  if (v.is_markup()) return v;
  std::string out = HtmlEscape(ToStr(v));
  JINJA_RETURN_IF_ERROR(r.CheckSize(out.size()));
  return Value::Markup(std::move(out));
}

absl::StatusOr<Value> FSum(Renderer& r, const Value& v, CallArgs& args) {
  Params p("sum", args, {"attribute", "start"});
  JINJA_RETURN_IF_ERROR(p.status());
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  Value total = p[1] != nullptr ? *p[1] : Value::Int(0);
  for (const Value& item : items) {
    Value x = item;
    if (p.Has(0)) {
      JINJA_ASSIGN_OR_RETURN(std::string attr, StrArg(p[0], "sum", "attribute"));
      JINJA_ASSIGN_OR_RETURN(x, AttrPath(r, item, attr));
    }
    if (!x.is_number() || !total.is_number()) return Bad("sum: items must be numbers");
    if (x.kind() == Kind::kFloat || total.kind() == Kind::kFloat) {
      total = Value::Float(total.float_value() + x.float_value());
    } else {
      int64_t s;
      if (__builtin_add_overflow(total.int_value(), x.int_value(), &s)) {
        return Bad("integer overflow");
      }
      total = Value::Int(s);
    }
  }
  return total;
}

absl::StatusOr<Value> MinMax(Renderer& r, const Value& v, CallArgs& args, bool max) {
  Params p(max ? "max" : "min", args, {"case_sensitive", "attribute"});
  JINJA_RETURN_IF_ERROR(p.status());
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  JINJA_ASSIGN_OR_RETURN(items, SortValues(
                                    r, std::move(items), [](const Value& x) { return x; },
                                    p.Has(0) && p[0]->Truthy(), max));
  return items.front();
}
absl::StatusOr<Value> FMin(Renderer& r, const Value& v, CallArgs& args) {
  return MinMax(r, v, args, false);
}
absl::StatusOr<Value> FMax(Renderer& r, const Value& v, CallArgs& args) {
  return MinMax(r, v, args, true);
}

const absl::flat_hash_map<absl::string_view, FilterFn>& Filters() {
  static const auto* filters = new absl::flat_hash_map<absl::string_view, FilterFn>{
      {"tojson", FTojson},
      {"length", FLength},
      {"count", FLength},
      {"trim", FTrim},
      {"items", FItems},
      {"string", FString},
      {"lower", FLower},
      {"upper", FUpper},
      {"capitalize", FCapitalize},
      {"title", FTitle},
      {"join", FJoin},
      {"list", FList},
      {"safe", FSafe},
      {"select", FSelect},
      {"reject", FReject},
      {"selectattr", FSelectattr},
      {"rejectattr", FRejectattr},
      {"indent", FIndent},
      {"replace", FReplace},
      {"map", FMap},
      {"unique", FUnique},
      {"default", FDefault},
      {"d", FDefault},
      {"first", FFirst},
      {"last", FLast},
      {"int", FInt},
      {"float", FFloat},
      {"abs", FAbs},
      {"dictsort", FDictsort},
      {"sort", FSort},
      {"reverse", FReverse},
      {"escape", FEscape},
      {"e", FEscape},
      {"sum", FSum},
      {"min", FMin},
      {"max", FMax},
  };
  return *filters;
}

}  // namespace

const FilterFn* FindFilter(absl::string_view name) {
  auto it = Filters().find(name);
  return it == Filters().end() ? nullptr : &it->second;
}

}  // namespace kvguard::core::jinja
