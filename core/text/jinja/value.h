// core/text/jinja/value.h: the values a chat template computes with, and their Python meaning.
//
// jinja2 evaluates templates with Python objects; byte-equal output needs Python's rules for
// the few types JSON and templates produce: None, bool (an int), int, float, str (code points,
// stored here as UTF-8), list/tuple, dict (insertion ordered), plus jinja2's Undefined, the
// mutable `namespace()` and callables (macros, builtins, bound methods). Lists and dicts are
// immutable once built (jinja2's ImmutableSandboxedEnvironment refuses list.append and friends),
// so copies share them; only a namespace is written in place.
#ifndef KVGUARD_CORE_TEXT_JINJA_VALUE_H_
#define KVGUARD_CORE_TEXT_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kvguard::core::jinja {

class Value;
class Renderer;

// Dict: string keys in insertion order (Python's dict, as JSON objects arrive).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  absl::flat_hash_map<std::string, size_t> index;

  const Value* Find(absl::string_view key) const;
  void Set(std::string key, Value value);
};

// CallArgs: the arguments of a call, `f(a, b, key=c)`.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using NativeFn = std::function<absl::StatusOr<Value>(Renderer&, CallArgs&)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kCallable
};

class Value {
 public:
  Value() = default;  // Undefined
  static Value Undefined(std::string name);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  // Markup: a string marked safe (markupsafe.Markup, from `|safe` and `|escape`): adding a
  // plain string to it HTML-escapes that string, as jinja2 does even with autoescape off.
  static Value Markup(std::string s);
  static Value List(std::vector<Value> items, bool tuple = false);
  // Generator: what jinja2's lazy filters (map, select, items, unique, reverse, ...) return: it
  // iterates like a list, but has no len(), no index, is always true and is not JSON.
  static Value Generator(std::vector<Value> items);
  static Value MakeDict(Dict dict);
  static Value Namespace(Dict dict);
  static Value Function(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  // is_number: bool, int or float (Python's bool is an int).
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  bool is_tuple() const { return tuple_; }
  bool is_generator() const { return generator_; }
  bool is_markup() const { return markup_; }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double float_value() const { return kind_ == Kind::kFloat ? f_ : double(int_value()); }
  const std::string& str() const { return *s_; }
  const std::vector<Value>& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_namespace() const { return *dict_; }
  const Callable& callable() const { return *fn_; }
  const std::string& undefined_name() const { return name_; }

  // Truthy: Python's bool(): empty strings and containers, zero, None and Undefined are false.
  bool Truthy() const;

  // TypeName: Python's type name, for error messages ("str", "dict", "NoneType", ...).
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  bool generator_ = false;
  bool markup_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const std::vector<Value>> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> fn_;
  std::string name_;  // an Undefined's name, for "'x' is undefined"
};

// ToStr: Python's str(v) as jinja2 prints it ({{ v }}); Undefined prints as "".
std::string ToStr(const Value& v);

// ToRepr: Python's repr(v): strings quoted, as inside a printed list.
std::string ToRepr(const Value& v);

// HtmlEscape: markupsafe.escape's text (& < > " ' as entities).
std::string HtmlEscape(absl::string_view s);

// FormatFloat: Python's repr of a float ("1.0", "1e+20", "0.0001", "inf", "nan").
std::string FormatFloat(double f);

// Equals: Python's ==, with 1 == 1.0 == True; Undefined equals only Undefined.
bool Equals(const Value& a, const Value& b);

// Compare: Python's <, for numbers with numbers and strings with strings (code point order,
// which is UTF-8 byte order); lists compare element by element. Returns -1, 0 or 1, or an
// error for other pairs ("'<' not supported between 'str' and 'int'").
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// FromJson: the value a JSON document becomes in Python (json.loads).
Value FromJson(const nlohmann::ordered_json& j);

// ToJsonText: json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
// as HuggingFace's `tojson` filter calls it. indent < 0: no indent (", " and ": "); indent >=
// 0: newlines and that many spaces per level ("," and ": "). Fails on values JSON cannot hold
// (Undefined, callables, namespaces) and when the text would pass max_bytes.
struct JsonFormat {
  int indent = -1;
  std::string item_separator;  // empty: the default for the indent
  std::string key_separator;
  bool sort_keys = false;
};
absl::StatusOr<std::string> ToJsonText(const Value& v, const JsonFormat& format, size_t max_bytes);

}  // namespace kvguard::core::jinja

#endif  // KVGUARD_CORE_TEXT_JINJA_VALUE_H_
