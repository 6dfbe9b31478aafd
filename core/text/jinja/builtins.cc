#include "core/text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <initializer_list>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/text/jinja/pystr.h"
#include "core/text/jinja/renderer.h"
#include "core/text/jinja/status_macros.h"

namespace kvguard::core::jinja {
namespace {

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

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::StatusOr<std::string> StrArg(const Value* v, absl::string_view fn, absl::string_view param) {
  if (v == nullptr || !v->is_string()) {
    return Bad(absl::StrCat("'", fn, "': '", param, "' must be a string"));
  }
  return v->str();
}

absl::StatusOr<int64_t> IntArg(const Value* v, int64_t def, absl::string_view fn,
                               absl::string_view param) {
  if (v == nullptr || v->is_none()) return def;
  if (v->kind() != Kind::kInt && v->kind() != Kind::kBool) {
    return Bad(absl::StrCat("'", fn, "': '", param, "' must be an integer"));
  }
  return v->int_value();
}

absl::StatusOr<Value> StringResult(Renderer& r, std::string s) {
  JINJA_RETURN_IF_ERROR(r.CheckSize(s.size()));
  return Value::String(std::move(s));
}

// AttrPath: jinja2's attribute getter for filters (`"a.b"`, digits index lists).
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
    if (cur.is_undefined()) return cur;
    JINJA_ASSIGN_OR_RETURN(cur, r.Attr(cur, std::string(part)));
  }
  return cur;
}

// ---- filters ----

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
  std::string sep;
  if (p.Has(0)) {
    JINJA_ASSIGN_OR_RETURN(sep, StrArg(p[0], "join", "d"));
  }
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

// ---- tests ----

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
  if (v.kind() != Kind::kInt || n.kind() != Kind::kInt) return Bad("divisibleby needs integers");
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

absl::StatusOr<Value> DictMethod(Renderer& r, const Value& d, const std::string& name,
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
    CallArgs none;
    return FItems(r, d, none);
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

const FilterFn* FindFilter(absl::string_view name) {
  auto it = Filters().find(name);
  return it == Filters().end() ? nullptr : &it->second;
}

const TestFn* FindTest(absl::string_view name) {
  auto it = Tests().find(name);
  return it == Tests().end() ? nullptr : &it->second;
}

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
