#include "core/text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/text/jinja/pystr.h"

namespace kvguard::core::jinja {

const Value* Dict::Find(absl::string_view key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &items[it->second].second;
}

void Dict::Set(std::string key, Value value) {
  auto it = index.find(key);
  if (it != index.end()) {
    items[it->second].second = std::move(value);
    return;
  }
  index.emplace(key, items.size());
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string name) {
  Value v;
  v.name_ = std::move(name);
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::Markup(std::string s) {
  Value v = String(std::move(s));
  v.markup_ = true;
  return v;
}
Value Value::List(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}
Value Value::Generator(std::vector<Value> items) {
  Value v = List(std::move(items));
  v.generator_ = true;
  return v;
}
Value Value::MakeDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}
Value Value::Namespace(Dict dict) {
  Value v = MakeDict(std::move(dict));
  v.kind_ = Kind::kNamespace;
  return v;
}
Value Value::Function(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return generator_ || !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return generator_ ? "generator" : tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

std::string HtmlEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string FormatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  // The shortest digits that round-trip, then Python's choice of notation: positional for
  // exponents in [-4, 16), scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_at = sci.find('e');
  std::string mant = sci.substr(0, e_at);
  const int exp = std::atoi(sci.c_str() + e_at + 1);
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + out + ebuf;
}

namespace {

bool PyPrintable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) {
    return false;
  }
  if ((c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF)) return false;
  return true;
}

std::string ReprString(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : CodePoints(s)) {
    if (c == char32_t(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!PyPrintable(c)) {
      char buf[16];
      if (c < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", unsigned(c));
      } else if (c < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", unsigned(c));
      }
      out += buf;
    } else {
      AppendUtf8(c, &out);
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace

std::string ToRepr(const Value& v) {
  if (v.is_generator()) return "<generator object>";
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kString:
      return ReprString(v.str());
    case Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += ", ";
        out += ToRepr(v.list()[i]);
      }
      if (v.is_tuple() && v.list().size() == 1) out += ",";
      out += v.is_tuple() ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(k) + ": " + ToRepr(val);
      }
      return out + "}";
    }
    default:
      return ToStr(v);
  }
}

std::string ToStr(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.bool_value() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.int_value());
    case Kind::kFloat:
      return FormatFloat(v.float_value());
    case Kind::kString:
      return v.str();
    case Kind::kList:
    case Kind::kDict:
      return ToRepr(v);
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(k) + ": " + ToRepr(val);
      }
      return out + "}>";
    }
    case Kind::kCallable:
      return "<function " + v.callable().name + ">";
  }
  return "";
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat) {
      return a.float_value() == b.float_value();
    }
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList: {
      if (a.is_generator() || b.is_generator()) return &a.list() == &b.list();
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equals(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, val] : a.dict().items) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !Equals(val, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return &a.dict() == &b.dict();
    case Kind::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat) {
      const double x = a.float_value(), y = b.float_value();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.int_value(), y = b.int_value();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot compare '", a.TypeName(), "' with '", b.TypeName(), "'"));
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value::Float(double(u));
      return Value::Int(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.Set(k, FromJson(e));
      return Value::MakeDict(std::move(d));
    }
    default:
      return Value::None();
  }
}

namespace {

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(c));
          *out += buf;
        } else {
          out->push_back(char(c));
        }
    }
  }
  out->push_back('"');
}

absl::Status AppendJson(const Value& v, const JsonFormat& f, int level, size_t max_bytes,
                        std::string* out) {
  if (out->size() > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("tojson output passes ", max_bytes, " bytes"));
  }
  if (level > 512) return absl::InvalidArgumentError("tojson: value nested too deeply");
  const std::string item_sep = !f.item_separator.empty() ? f.item_separator
                               : f.indent >= 0           ? ","
                                                         : ", ";
  const std::string key_sep = !f.key_separator.empty() ? f.key_separator : ": ";
  auto newline = [&](int lvl) {
    if (f.indent < 0) return;
    out->push_back('\n');
    out->append(size_t(f.indent) * size_t(lvl), ' ');
  };
  switch (v.kind()) {
    case Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Kind::kInt:
      *out += std::to_string(v.int_value());
      return absl::OkStatus();
    case Kind::kFloat: {
      const double d = v.float_value();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        *out += FormatFloat(d);
      }
      return absl::OkStatus();
    }
    case Kind::kString:
      AppendJsonString(v.str(), out);
      return absl::OkStatus();
    case Kind::kList: {
      if (v.is_generator()) {
        return absl::InvalidArgumentError(
            "tojson: object of type 'generator' is not JSON serializable");
      }
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) *out += item_sep;
        newline(level + 1);
        if (absl::Status s = AppendJson(v.list()[i], f, level + 1, max_bytes, out); !s.ok()) {
          return s;
        }
      }
      newline(level);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Kind::kDict: {
      if (v.dict().items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict().items) items.push_back(&item);
      if (f.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(level + 1);
        AppendJsonString(items[i]->first, out);
        *out += key_sep;
        if (absl::Status s = AppendJson(items[i]->second, f, level + 1, max_bytes, out); !s.ok()) {
          return s;
        }
      }
      newline(level);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: object of type '", v.TypeName(), "' is not JSON serializable"));
  }
}

}  // namespace

absl::StatusOr<std::string> ToJsonText(const Value& v, const JsonFormat& format, size_t max_bytes) {
  std::string out;
  if (absl::Status s = AppendJson(v, format, 0, max_bytes, &out); !s.ok()) return s;
  if (out.size() > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("tojson output passes ", max_bytes, " bytes"));
  }
  return out;
}

}  // namespace kvguard::core::jinja
