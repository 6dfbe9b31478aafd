// core/text/jinja/expressions.cc: the renderer's half that evaluates expressions: names,
// operators with Python's rules, attribute and item access, slices, calls, filters and tests.
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/text/jinja/builtins.h"
#include "core/text/jinja/pystr.h"
#include "core/text/jinja/renderer.h"
#include "core/text/jinja/status_macros.h"

namespace kvguard::core::jinja {
namespace {

absl::Status TypeError(absl::string_view op, const Value& a, const Value& b) {
  return absl::InvalidArgumentError(absl::StrCat("unsupported operand types for ", op, ": '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

absl::Status UndefinedError(const Value& v) {
  return absl::InvalidArgumentError(v.undefined_name().empty() ? "value is undefined"
                                                               : v.undefined_name());
}

// Python's floor division and modulo for ints.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

absl::StatusOr<Value> Renderer::Call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) return UndefinedError(fn);
  if (fn.kind() != Kind::kCallable) {
    return absl::InvalidArgumentError(absl::StrCat("'", fn.TypeName(), "' object is not callable"));
  }
  Depth depth(this);
  JINJA_RETURN_IF_ERROR(CheckDepth());
  return fn.callable().fn(*this, args);
}

absl::StatusOr<Value> Renderer::Eval(const Expr& e, const ScopePtr& scope) {
  Depth depth(this);
  JINJA_RETURN_IF_ERROR(CheckDepth());
  JINJA_RETURN_IF_ERROR(Charge(1));
  absl::StatusOr<Value> v = EvalInner(e, scope);
  if (!v.ok()) return WithLine(v.status(), e.line);
  return v;
}

absl::StatusOr<CallArgs> Renderer::EvalArgs(const Expr& e, size_t first, const ScopePtr& scope) {
  CallArgs args;
  for (size_t i = first; i < e.children.size(); ++i) {
    JINJA_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i], scope));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [key, expr] : e.kwargs) {
    JINJA_ASSIGN_OR_RETURN(Value v, Eval(*expr, scope));
    args.keyword.emplace_back(key, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Renderer::EvalInner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName: {
      const Value* v = scope->Find(e.name);
      if (v == nullptr) return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
      return *v;
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const ExprPtr& c : e.children) {
        JINJA_ASSIGN_OR_RETURN(Value v, Eval(*c, scope));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        JINJA_ASSIGN_OR_RETURN(Value k, Eval(*e.children[i], scope));
        if (!k.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("dict keys must be strings, not '", k.TypeName(), "'"));
        }
        JINJA_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1], scope));
        d.Set(k.str(), std::move(v));
      }
      return Value::MakeDict(std::move(d));
    }
    case ExprKind::kAttr: {
      JINJA_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
      return Attr(obj, e.name);
    }
    case ExprKind::kItem: {
      JINJA_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
      JINJA_ASSIGN_OR_RETURN(Value index, Eval(*e.children[1], scope));
      return Item(obj, index);
    }
    case ExprKind::kSlice: {
      JINJA_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
      Value parts[3] = {Value::None(), Value::None(), Value::None()};
      for (int i = 0; i < 3; ++i) {
        if (e.children[size_t(i) + 1]) {
          JINJA_ASSIGN_OR_RETURN(parts[i], Eval(*e.children[size_t(i) + 1], scope));
        }
      }
      return Slice(obj, parts[0], parts[1], parts[2]);
    }
    case ExprKind::kCall: {
      JINJA_ASSIGN_OR_RETURN(Value fn, Eval(*e.children[0], scope));
      JINJA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
      return Call(fn, args);
    }
    case ExprKind::kFilter: {
      JINJA_ASSIGN_OR_RETURN(Value input, Eval(*e.children[0], scope));
      JINJA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
      return ApplyFilter(e.name, input, args);
    }
    case ExprKind::kTest: {
      JINJA_ASSIGN_OR_RETURN(Value input, Eval(*e.children[0], scope));
      JINJA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
      JINJA_ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, input, args));
      return Value::Bool(result != e.negated);
    }
    case ExprKind::kNot: {
      JINJA_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
      return Value::Bool(!v.Truthy());
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      JINJA_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
      if (v.is_undefined()) return UndefinedError(v);
      if (!v.is_number()) {
        return absl::InvalidArgumentError(absl::StrCat("bad operand type for unary ",
                                                       e.kind == ExprKind::kNeg ? "-" : "+", ": '",
                                                       v.TypeName(), "'"));
      }
      if (e.kind == ExprKind::kPos) {
        return v.kind() == Kind::kFloat ? v : Value::Int(v.int_value());
      }
      if (v.kind() == Kind::kFloat) return Value::Float(-v.float_value());
      if (v.int_value() == std::numeric_limits<int64_t>::min()) {
        return absl::InvalidArgumentError("integer overflow");
      }
      return Value::Int(-v.int_value());
    }
    case ExprKind::kBinary: {
      JINJA_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0], scope));
      JINJA_ASSIGN_OR_RETURN(Value b, Eval(*e.children[1], scope));
      return Binary(e.name, a, b);
    }
    case ExprKind::kAnd: {
      JINJA_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0], scope));
      if (!a.Truthy()) return a;
      return Eval(*e.children[1], scope);
    }
    case ExprKind::kOr: {
      JINJA_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0], scope));
      if (a.Truthy()) return a;
      return Eval(*e.children[1], scope);
    }
    case ExprKind::kCompare: {
      JINJA_ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], scope));
      for (size_t i = 0; i < e.ops.size(); ++i) {
        JINJA_ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1], scope));
        const std::string& op = e.ops[i];
        bool result;
        if (op == "==") {
          result = Equals(left, right);
        } else if (op == "!=") {
          result = !Equals(left, right);
        } else if (op == "in" || op == "notin") {
          JINJA_ASSIGN_OR_RETURN(bool in, Contains(right, left));
          result = in == (op == "in");
        } else {
          if (left.is_undefined()) return UndefinedError(left);
          if (right.is_undefined()) return UndefinedError(right);
          JINJA_ASSIGN_OR_RETURN(int c, Compare(left, right));
          result = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!result) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case ExprKind::kCond: {
      JINJA_ASSIGN_OR_RETURN(Value c, Eval(*e.children[1], scope));
      if (c.Truthy()) return Eval(*e.children[0], scope);
      if (e.children[2]) return Eval(*e.children[2], scope);
      return Value::Undefined("the if-expression had no else branch");
    }
    case ExprKind::kBlockInput:
      return block_input_;
  }
  return absl::InternalError("unknown expression kind");
}

absl::StatusOr<bool> Renderer::Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'in <string>' requires string as left operand, not '", item.TypeName(), "'"));
      }
      JINJA_RETURN_IF_ERROR(Charge(int64_t(container.str().size() / 64)));
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      JINJA_RETURN_IF_ERROR(Charge(int64_t(container.list().size() / 16)));
      for (const Value& v : container.list()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
    case Kind::kNamespace:
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    case Kind::kUndefined:
      return false;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

absl::StatusOr<Value> Renderer::Binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = ToStr(a) + ToStr(b);
    JINJA_RETURN_IF_ERROR(CheckSize(s.size()));
    return Value::String(std::move(s));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    const bool floats = a.kind() == Kind::kFloat || b.kind() == Kind::kFloat;
    if (op == "/") {
      if (b.float_value() == 0) return absl::InvalidArgumentError("division by zero");
      return Value::Float(a.float_value() / b.float_value());
    }
    if (floats) {
      const double x = a.float_value(), y = b.float_value();
      if (op == "+") return Value::Float(x + y);
      if (op == "-") return Value::Float(x - y);
      if (op == "*") return Value::Float(x * y);
      if (op == "**") {
        // Python: a negative base to a fractional power is complex, and a finite power that
        // overflows is an OverflowError; neither is a value a template can print.
        const double p = std::pow(x, y);
        if (std::isnan(p) && !std::isnan(x) && !std::isnan(y)) {
          return absl::InvalidArgumentError("negative number raised to a fractional power");
        }
        if (std::isinf(p) && std::isfinite(x) && std::isfinite(y)) {
          if (x == 0) return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
          return absl::InvalidArgumentError("float power overflows");
        }
        return Value::Float(p);
      }
      if (y == 0) return absl::InvalidArgumentError("float division by zero");
      if (op == "//") return Value::Float(std::floor(x / y));
      if (op == "%") {
        // Python's float modulo: the sign of the divisor, and a zero result signed like it.
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        if (m == 0) m = std::copysign(0.0, y);
        return Value::Float(m);
      }
    } else {
      const int64_t x = a.int_value(), y = b.int_value();
      int64_t r;
      if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value::Int(r);
      if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::Int(r);
      if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::Int(r);
      if (op == "//" || op == "%") {
        if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          return absl::InvalidArgumentError("integer overflow");
        }
        const int64_t q = FloorDiv(x, y);
        return Value::Int(op == "//" ? q : x - q * y);
      }
      if (op == "**") {
        if (y < 0) {
          if (x == 0) return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
          return Value::Float(std::pow(double(x), double(y)));
        }
        // Square and multiply; a square that overflows is always needed later (unless the
        // base is 0 or +-1, whose squares never overflow), so overflow is an error.
        int64_t result = 1, base = x, e = y;
        bool overflow = false;
        while (e > 0 && !overflow) {
          if (e & 1) overflow = __builtin_mul_overflow(result, base, &result);
          e >>= 1;
          if (e > 0 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
        }
        if (!overflow) return Value::Int(result);
      }
      return absl::InvalidArgumentError("integer overflow");
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {
        // Markup + str escapes the str (markupsafe), whichever side the Markup is on.
        std::string s = (a.is_markup() ? a.str() : HtmlEscape(a.str())) +
                        (b.is_markup() ? b.str() : HtmlEscape(b.str()));
        JINJA_RETURN_IF_ERROR(CheckSize(s.size()));
        return Value::Markup(std::move(s));
      }
      JINJA_RETURN_IF_ERROR(CheckSize(a.str().size() + b.str().size()));
      return Value::String(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() &&
        !b.is_generator()) {
      JINJA_RETURN_IF_ERROR(CheckSize(a.list().size() + b.list().size()));
      std::vector<Value> items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items), a.is_tuple());
    }
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list() ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || (seq->is_list() && !seq->is_generator())) &&
        (count->kind() == Kind::kInt || count->kind() == Kind::kBool)) {
      const int64_t n = std::max<int64_t>(0, count->int_value());
      const size_t unit = seq->is_string() ? seq->str().size() : seq->list().size();
      if (unit != 0 && uint64_t(n) > limits_.max_output_bytes / unit) {
        return CheckSize(limits_.max_output_bytes + 1);
      }
      JINJA_RETURN_IF_ERROR(CheckSize(unit * size_t(n)));
      if (seq->is_string()) {
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq->str();
        return seq->is_markup() ? Value::Markup(std::move(s)) : Value::String(std::move(s));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) {
        items.insert(items.end(), seq->list().begin(), seq->list().end());
      }
      return Value::List(std::move(items), seq->is_tuple());
    }
  }
  return TypeError(op, a, b);
}

absl::StatusOr<Value> Renderer::Attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (Value method = BoundMethod(obj, name); !method.is_undefined()) return method;
  if (obj.is_dict() || obj.kind() == Kind::kNamespace) {
    if (const Value* v = obj.dict().Find(name)) return *v;
  }
  return Value::Undefined(
      absl::StrCat("'", obj.TypeName(), " object' has no attribute '", name, "'"));
}

absl::StatusOr<Value> Renderer::Item(const Value& obj, const Value& index) {
  if (obj.is_undefined()) return UndefinedError(obj);
  auto missing = [&] {
    return Value::Undefined(
        absl::StrCat("'", obj.TypeName(), " object' has no item ", ToRepr(index)));
  };
  if (obj.is_generator()) return missing();
  if ((obj.is_list() || obj.is_string()) &&
      (index.kind() == Kind::kInt || index.kind() == Kind::kBool)) {
    int64_t i = index.int_value();
    if (obj.is_list()) {
      const int64_t n = int64_t(obj.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return missing();
      return obj.list()[size_t(i)];
    }
    const std::vector<char32_t> cps = CodePoints(obj.str());
    const int64_t n = int64_t(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return missing();
    return Value::String(EncodeUtf8(cps, size_t(i), size_t(i) + 1));
  }
  if ((obj.is_dict() || obj.kind() == Kind::kNamespace) && index.is_string()) {
    if (const Value* v = obj.dict().Find(index.str())) return *v;
    return missing();
  }
  if (index.is_string()) return Attr(obj, index.str());
  return missing();
}

absl::StatusOr<Value> Renderer::Slice(const Value& obj, const Value& start, const Value& stop,
                                      const Value& step) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_generator()) return Value::Undefined("'generator' object is not subscriptable");
  auto as_index = [](const Value& v, int64_t* out) -> absl::Status {
    if (v.is_none()) return absl::OkStatus();
    if (v.kind() != Kind::kInt && v.kind() != Kind::kBool) {
      return absl::InvalidArgumentError("slice indices must be integers or None");
    }
    *out = v.int_value();
    return absl::OkStatus();
  };
  int64_t st = 1;
  JINJA_RETURN_IF_ERROR(as_index(step, &st));
  if (st == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  std::vector<char32_t> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = CodePoints(obj.str());
    n = int64_t(cps.size());
  } else if (obj.is_list()) {
    n = int64_t(obj.list().size());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  // Python's slice.indices().
  int64_t lo, hi;
  if (st > 0) {
    lo = 0;
    hi = n;
  } else {
    lo = n - 1;
    hi = -1;
  }
  auto clamp = [&](const Value& v, int64_t def, int64_t* out) -> absl::Status {
    if (v.is_none()) {
      *out = def;
      return absl::OkStatus();
    }
    int64_t x = 0;
    JINJA_RETURN_IF_ERROR(as_index(v, &x));
    if (x < 0) {
      x = x < -n ? (st > 0 ? 0 : -1) : x + n;
    } else if (x >= n) {
      x = st > 0 ? n : n - 1;
    }
    *out = x;
    return absl::OkStatus();
  };
  JINJA_RETURN_IF_ERROR(clamp(start, lo, &lo));
  JINJA_RETURN_IF_ERROR(clamp(stop, hi, &hi));
  std::vector<size_t> picks;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) picks.push_back(size_t(i));
  JINJA_RETURN_IF_ERROR(CheckSize(picks.size()));
  if (obj.is_string()) {
    std::string s;
    for (size_t i : picks) AppendUtf8(cps[i], &s);
    return Value::String(std::move(s));
  }
  std::vector<Value> items;
  for (size_t i : picks) items.push_back(obj.list()[i]);
  return Value::List(std::move(items), obj.is_tuple());
}

absl::StatusOr<Value> Renderer::ApplyFilter(const std::string& name, const Value& input,
                                            CallArgs& args) {
  const FilterFn* f = FindFilter(name);
  if (f == nullptr) return absl::InvalidArgumentError(absl::StrCat("no filter named '", name, "'"));
  return (*f)(*this, input, args);
}

absl::StatusOr<bool> Renderer::ApplyTest(const std::string& name, const Value& input,
                                         CallArgs& args) {
  const TestFn* t = FindTest(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("no test named '", name, "'"));
  return (*t)(*this, input, args);
}

}  // namespace kvguard::core::jinja
