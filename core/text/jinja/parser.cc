#include "core/text/jinja/parser.h"

#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/text/jinja/status_macros.h"

namespace kvguard::core::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  absl::StatusOr<Body> Template() {
    std::string end;
    JINJA_ASSIGN_OR_RETURN(Body body, Statements({}, &end));
    if (Cur().kind != Tok::kEof) return Error("unexpected tag");
    return body;
  }

 private:
  // ---- token stream ----
  const Token& Cur() const { return t_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    return t_[pos_ + ahead < t_.size() ? pos_ + ahead : t_.size() - 1];
  }
  void Next() {
    if (pos_ + 1 < t_.size()) ++pos_;
  }
  bool IsOp(absl::string_view op) const { return Cur().kind == Tok::kOp && Cur().text == op; }
  bool IsName(absl::string_view name) const {
    return Cur().kind == Tok::kName && Cur().text == name;
  }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  absl::Status Error(absl::string_view what) const {
    std::string got;
    switch (Cur().kind) {
      case Tok::kEof:
        got = "end of template";
        break;
      case Tok::kBlockEnd:
        got = "'%}'";
        break;
      case Tok::kVarEnd:
        got = "'}}'";
        break;
      case Tok::kText:
        got = "text";
        break;
      default:
        got = absl::StrCat("'", Cur().text, "'");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("line ", Cur().line, ": ", what, " (at ", got, ")"));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) return Error(absl::StrCat("expected '", op, "'"));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().kind != Tok::kName) return Error("expected a name");
    std::string name = Cur().text;
    Next();
    return name;
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().kind != Tok::kBlockEnd) return Error("expected '%}'");
    Next();
    return absl::OkStatus();
  }

  // Nesting guards the recursion: one level per block and per expression operand.
  struct Nest {
    explicit Nest(Parser* p) : p(p) { ++p->depth_; }
    ~Nest() { --p->depth_; }
    Parser* p;
  };
  absl::Status CheckDepth() const {
    if (depth_ > kMaxNesting) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", Cur().line, ": nested more than ", kMaxNesting, " levels deep"));
    }
    return absl::OkStatus();
  }

  ExprPtr Make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- statements ----

  // Statements parses until EOF or a block tag whose name is in `ends`; leaves the stream at
  // that name (after `{%`) and stores it in *end.
  absl::StatusOr<Body> Statements(const std::vector<absl::string_view>& ends, std::string* end) {
    Nest nest(this);
    JINJA_RETURN_IF_ERROR(CheckDepth());
    Body body;
    while (true) {
      const Token& tok = Cur();
      if (tok.kind == Tok::kEof) {
        if (!ends.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("line ", tok.line, ": unexpected end of template: expected '{% ",
                           ends.back(), " %}'"));
        }
        return body;
      }
      if (tok.kind == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = tok.line;
        s->text = tok.text;
        body.push_back(std::move(s));
        Next();
        continue;
      }
      if (tok.kind == Tok::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = tok.line;
        JINJA_ASSIGN_OR_RETURN(s->expr, Tuple(true, false));
        if (Cur().kind != Tok::kVarEnd) return Error("expected '}}'");
        Next();
        body.push_back(std::move(s));
        continue;
      }
      if (tok.kind != Tok::kBlockBegin) return Error("unexpected token");
      Next();
      if (Cur().kind != Tok::kName) return Error("expected a tag name");
      for (absl::string_view e : ends) {
        if (Cur().text == e) {
          *end = Cur().text;
          Next();
          return body;
        }
      }
      JINJA_ASSIGN_OR_RETURN(StmtPtr s, Statement());
      body.push_back(std::move(s));
    }
  }

  absl::StatusOr<StmtPtr> Statement() {
    const std::string tag = Cur().text;
    const int line = Cur().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    Next();
    std::string end;
    if (tag == "if") {
      s->kind = StmtKind::kIf;
      JINJA_ASSIGN_OR_RETURN(ExprPtr cond, Tuple(true, false));
      JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
      while (true) {
        JINJA_ASSIGN_OR_RETURN(Body body, Statements({"elif", "else", "endif"}, &end));
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          JINJA_ASSIGN_OR_RETURN(cond, Tuple(true, false));
          JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
          continue;
        }
        if (end == "else") {
          JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
          JINJA_ASSIGN_OR_RETURN(Body else_body, Statements({"endif"}, &end));
          s->branches.emplace_back(nullptr, std::move(else_body));
        }
        break;
      }
    } else if (tag == "for") {
      s->kind = StmtKind::kFor;
      JINJA_ASSIGN_OR_RETURN(s->targets, Targets());
      if (!SkipName("in")) return Error("expected 'in'");
      JINJA_ASSIGN_OR_RETURN(s->expr, Tuple(false, false));
      if (SkipName("if")) {
        JINJA_ASSIGN_OR_RETURN(s->cond, Expression(true));
      }
      if (IsName("recursive")) return Error("recursive loops are not supported");
      JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
      ++loops_;
      auto body = Statements({"endfor", "else"}, &end);
      --loops_;
      if (!body.ok()) return body.status();
      s->body = *std::move(body);
      if (end == "else") {
        JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
        JINJA_ASSIGN_OR_RETURN(s->else_body, Statements({"endfor"}, &end));
      }
    } else if (tag == "set") {
      JINJA_ASSIGN_OR_RETURN(std::string first, ExpectName());
      if (SkipOp(".")) {
        s->kind = StmtKind::kSet;
        s->targets.push_back(first);
        JINJA_ASSIGN_OR_RETURN(s->attr, ExpectName());
        JINJA_RETURN_IF_ERROR(ExpectOp("="));
        JINJA_ASSIGN_OR_RETURN(s->expr, Tuple(true, false));
      } else if (IsOp("=") || IsOp(",")) {
        s->kind = StmtKind::kSet;
        s->targets.push_back(first);
        while (SkipOp(",")) {
          if (IsOp("=")) break;
          JINJA_ASSIGN_OR_RETURN(std::string more, ExpectName());
          s->targets.push_back(more);
        }
        JINJA_RETURN_IF_ERROR(ExpectOp("="));
        JINJA_ASSIGN_OR_RETURN(s->expr, Tuple(true, false));
      } else {
        s->kind = StmtKind::kSetBlock;
        s->targets.push_back(first);
        if (IsOp("|")) {
          JINJA_ASSIGN_OR_RETURN(s->filter, FilterChain(line));
        }
        JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
        JINJA_ASSIGN_OR_RETURN(s->body, Statements({"endset"}, &end));
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::kMacro;
      JINJA_ASSIGN_OR_RETURN(s->name, ExpectName());
      JINJA_RETURN_IF_ERROR(ExpectOp("("));
      while (!IsOp(")")) {
        if (!s->targets.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
        JINJA_ASSIGN_OR_RETURN(std::string param, ExpectName());
        s->targets.push_back(param);
        ExprPtr def;
        if (SkipOp("=")) {
          JINJA_ASSIGN_OR_RETURN(def, Expression(true));
        }
        s->defaults.push_back(std::move(def));
      }
      Next();
      JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
      const int loops = loops_;
      loops_ = 0;  // a macro's body is not inside the caller's loop
      auto body = Statements({"endmacro"}, &end);
      loops_ = loops;
      if (!body.ok()) return body.status();
      s->body = *std::move(body);
    } else if (tag == "filter") {
      s->kind = StmtKind::kFilterBlock;
      auto input = Make(ExprKind::kBlockInput, line);
      JINJA_ASSIGN_OR_RETURN(s->filter, Filter(std::move(input), /*after_pipe=*/true));
      while (IsOp("|")) {
        JINJA_ASSIGN_OR_RETURN(s->filter, Filter(std::move(s->filter)));
      }
      JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
      JINJA_ASSIGN_OR_RETURN(s->body, Statements({"endfilter"}, &end));
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      if (loops_ == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line, ": '", tag, "' outside a for loop"));
      }
    } else if (tag == "generation") {
      s->kind = StmtKind::kBlock;
      JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
      JINJA_ASSIGN_OR_RETURN(s->body, Statements({"endgeneration"}, &end));
    } else {
      pos_--;
      return Error(absl::StrCat("unknown or unsupported tag '", tag, "'"));
    }
    JINJA_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  // Targets: `a`, `a, b` or `(a, b)` (for loops).
  absl::StatusOr<std::vector<std::string>> Targets() {
    std::vector<std::string> names;
    const bool paren = SkipOp("(");
    do {
      if (IsName("in")) break;
      JINJA_ASSIGN_OR_RETURN(std::string name, ExpectName());
      names.push_back(name);
    } while (SkipOp(","));
    if (paren) JINJA_RETURN_IF_ERROR(ExpectOp(")"));
    return names;
  }

  absl::StatusOr<ExprPtr> FilterChain(int line) {
    ExprPtr e = Make(ExprKind::kBlockInput, line);
    while (IsOp("|")) {
      JINJA_ASSIGN_OR_RETURN(e, Filter(std::move(e)));
    }
    return e;
  }

  // ---- expressions ----

  // Tuple: `a, b` without parentheses becomes a tuple (print and set values); else one
  // expression.
  absl::StatusOr<ExprPtr> Tuple(bool with_condexpr, bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!SkipOp(",")) break;
        is_tuple = true;
      }
      if (Cur().kind == Tok::kBlockEnd || Cur().kind == Tok::kVarEnd || IsOp(")") ||
          (!with_condexpr && IsName("if"))) {
        break;
      }
      JINJA_ASSIGN_OR_RETURN(ExprPtr e, Expression(with_condexpr));
      items.push_back(std::move(e));
    }
    if (!is_tuple) {
      if (items.empty()) {
        if (explicit_parens) return Make(ExprKind::kTuple, line);
        return Error("expected an expression");
      }
      return std::move(items[0]);
    }
    auto t = Make(ExprKind::kTuple, line);
    t->children = std::move(items);
    return t;
  }

  absl::StatusOr<ExprPtr> Expression(bool with_condexpr) {
    Nest nest(this);
    JINJA_RETURN_IF_ERROR(CheckDepth());
    JINJA_ASSIGN_OR_RETURN(ExprPtr e, Or());
    while (with_condexpr && IsName("if")) {
      const int line = Cur().line;
      Next();
      auto c = Make(ExprKind::kCond, line);
      JINJA_ASSIGN_OR_RETURN(ExprPtr cond, Or());
      ExprPtr otherwise;
      if (SkipName("else")) {
        JINJA_ASSIGN_OR_RETURN(otherwise, Expression(true));
      }
      c->children.push_back(std::move(e));
      c->children.push_back(std::move(cond));
      c->children.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Binary(ExprKind kind, std::string op, ExprPtr l, ExprPtr r, int line) {
    auto e = Make(kind, line);
    e->name = std::move(op);
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  absl::StatusOr<ExprPtr> Or() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr e, And());
    while (IsName("or")) {
      const int line = Cur().line;
      Next();
      JINJA_ASSIGN_OR_RETURN(ExprPtr r, And());
      JINJA_ASSIGN_OR_RETURN(e, Binary(ExprKind::kOr, "or", std::move(e), std::move(r), line));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> And() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr e, Not());
    while (IsName("and")) {
      const int line = Cur().line;
      Next();
      JINJA_ASSIGN_OR_RETURN(ExprPtr r, Not());
      JINJA_ASSIGN_OR_RETURN(e, Binary(ExprKind::kAnd, "and", std::move(e), std::move(r), line));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Not() {
    if (IsName("not")) {
      Nest nest(this);
      JINJA_RETURN_IF_ERROR(CheckDepth());
      auto e = Make(ExprKind::kNot, Cur().line);
      Next();
      JINJA_ASSIGN_OR_RETURN(ExprPtr operand, Not());
      e->children.push_back(std::move(operand));
      return e;
    }
    return CompareExpr();
  }

  absl::StatusOr<ExprPtr> CompareExpr() {
    const int line = Cur().line;
    JINJA_ASSIGN_OR_RETURN(ExprPtr first, Math1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().kind == Tok::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
           Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().kind == Tok::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(ExprKind::kCompare, line);
        cmp->children.push_back(std::move(first));
      }
      JINJA_ASSIGN_OR_RETURN(ExprPtr operand, Math1());
      cmp->children.push_back(std::move(operand));
      cmp->ops.push_back(op);
    }
    if (cmp) return cmp;
    return first;
  }

  absl::StatusOr<ExprPtr> Math1() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr e, Concat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Next();
      JINJA_ASSIGN_OR_RETURN(ExprPtr r, Concat());
      JINJA_ASSIGN_OR_RETURN(e, Binary(ExprKind::kBinary, op, std::move(e), std::move(r), line));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Concat() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr e, Math2());
    while (IsOp("~")) {
      const int line = Cur().line;
      Next();
      JINJA_ASSIGN_OR_RETURN(ExprPtr r, Math2());
      JINJA_ASSIGN_OR_RETURN(e, Binary(ExprKind::kBinary, "~", std::move(e), std::move(r), line));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Math2() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr e, Pow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Next();
      JINJA_ASSIGN_OR_RETURN(ExprPtr r, Pow());
      JINJA_ASSIGN_OR_RETURN(e, Binary(ExprKind::kBinary, op, std::move(e), std::move(r), line));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Pow() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr e, Unary(true));
    while (IsOp("**")) {
      const int line = Cur().line;
      Next();
      JINJA_ASSIGN_OR_RETURN(ExprPtr r, Unary(true));
      JINJA_ASSIGN_OR_RETURN(e, Binary(ExprKind::kBinary, "**", std::move(e), std::move(r), line));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Unary(bool with_filter) {
    Nest nest(this);
    JINJA_RETURN_IF_ERROR(CheckDepth());
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(IsOp("-") ? ExprKind::kNeg : ExprKind::kPos, Cur().line);
      Next();
      JINJA_ASSIGN_OR_RETURN(ExprPtr operand, Unary(false));
      e->children.push_back(std::move(operand));
    } else {
      JINJA_ASSIGN_OR_RETURN(e, Primary());
    }
    JINJA_ASSIGN_OR_RETURN(e, Postfix(std::move(e)));
    if (with_filter) {
      JINJA_ASSIGN_OR_RETURN(e, FilterExpr(std::move(e)));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Primary() {
    const Token& tok = Cur();
    const int line = tok.line;
    if (tok.kind == Tok::kName) {
      auto e = Make(ExprKind::kLiteral, line);
      if (tok.text == "true" || tok.text == "True") {
        e->literal = Value::Bool(true);
      } else if (tok.text == "false" || tok.text == "False") {
        e->literal = Value::Bool(false);
      } else if (tok.text == "none" || tok.text == "None") {
        e->literal = Value::None();
      } else {
        e->kind = ExprKind::kName;
        e->name = tok.text;
      }
      Next();
      return e;
    }
    if (tok.kind == Tok::kString) {
      std::string s;
      while (Cur().kind == Tok::kString) {
        s += Cur().text;
        Next();
      }
      auto e = Make(ExprKind::kLiteral, line);
      e->literal = Value::String(std::move(s));
      return e;
    }
    if (tok.kind == Tok::kInt) {
      int64_t v;
      if (!absl::SimpleAtoi(tok.text, &v)) return Error("integer literal out of range");
      auto e = Make(ExprKind::kLiteral, line);
      e->literal = Value::Int(v);
      Next();
      return e;
    }
    if (tok.kind == Tok::kFloat) {
      errno = 0;
      const double v = std::strtod(tok.text.c_str(), nullptr);
      if (errno == ERANGE && v != 0) return Error("float literal out of range");
      auto e = Make(ExprKind::kLiteral, line);
      e->literal = Value::Float(v);
      Next();
      return e;
    }
    if (SkipOp("(")) {
      JINJA_ASSIGN_OR_RETURN(ExprPtr e, Tuple(true, true));
      JINJA_RETURN_IF_ERROR(ExpectOp(")"));
      return e;
    }
    if (SkipOp("[")) {
      auto e = Make(ExprKind::kList, line);
      while (!IsOp("]")) {
        if (!e->children.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("]")) break;
        JINJA_ASSIGN_OR_RETURN(ExprPtr item, Expression(true));
        e->children.push_back(std::move(item));
      }
      Next();
      return e;
    }
    if (SkipOp("{")) {
      auto e = Make(ExprKind::kDict, line);
      while (!IsOp("}")) {
        if (!e->children.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("}")) break;
        JINJA_ASSIGN_OR_RETURN(ExprPtr key, Expression(true));
        JINJA_RETURN_IF_ERROR(ExpectOp(":"));
        JINJA_ASSIGN_OR_RETURN(ExprPtr value, Expression(true));
        e->children.push_back(std::move(key));
        e->children.push_back(std::move(value));
      }
      Next();
      return e;
    }
    return Error("expected an expression");
  }

  absl::StatusOr<ExprPtr> Postfix(ExprPtr e) {
    while (true) {
      const int line = Cur().line;
      if (SkipOp(".")) {
        if (Cur().kind == Tok::kName) {
          auto a = Make(ExprKind::kAttr, line);
          a->name = Cur().text;
          a->children.push_back(std::move(e));
          e = std::move(a);
          Next();
        } else if (Cur().kind == Tok::kInt) {
          auto a = Make(ExprKind::kItem, line);
          a->children.push_back(std::move(e));
          JINJA_ASSIGN_OR_RETURN(ExprPtr index, Primary());
          a->children.push_back(std::move(index));
          e = std::move(a);
        } else {
          return Error("expected an attribute name after '.'");
        }
      } else if (SkipOp("[")) {
        JINJA_ASSIGN_OR_RETURN(e, Subscript(std::move(e), line));
      } else if (IsOp("(")) {
        JINJA_ASSIGN_OR_RETURN(e, Call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> Subscript(ExprPtr object, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!IsOp("]")) {
      if (SkipOp(":")) {
        slice = true;
        if (++part > 2) return Error("too many ':' in a slice");
        continue;
      }
      if (parts[part]) return Error("expected ':' or ']'");
      JINJA_ASSIGN_OR_RETURN(parts[part], Expression(true));
    }
    Next();
    if (!slice) {
      if (!parts[0]) return Error("empty subscript");
      auto e = Make(ExprKind::kItem, line);
      e->children.push_back(std::move(object));
      e->children.push_back(std::move(parts[0]));
      return e;
    }
    auto e = Make(ExprKind::kSlice, line);
    e->children.push_back(std::move(object));
    for (auto& p : parts) e->children.push_back(std::move(p));
    return e;
  }

  // Args parses `(a, b, key=c)` into e's children (after the existing ones) and kwargs.
  absl::Status Args(Expr* e) {
    JINJA_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) return Error("*args and **kwargs are not supported");
      if (Cur().kind == Tok::kName && Peek().kind == Tok::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        JINJA_ASSIGN_OR_RETURN(ExprPtr value, Expression(true));
        e->kwargs.emplace_back(std::move(key), std::move(value));
        continue;
      }
      if (!e->kwargs.empty()) return Error("positional argument after a keyword argument");
      JINJA_ASSIGN_OR_RETURN(ExprPtr arg, Expression(true));
      e->children.push_back(std::move(arg));
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> Call(ExprPtr callee) {
    auto e = Make(ExprKind::kCall, Cur().line);
    e->children.push_back(std::move(callee));
    JINJA_RETURN_IF_ERROR(Args(e.get()));
    return e;
  }

  absl::StatusOr<std::string> DottedName() {
    JINJA_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".") && Peek().kind == Tok::kName) {
      Next();
      name += "." + Cur().text;
      Next();
    }
    return name;
  }

  // Filter parses `| name(args)` applied to `input` (`name(args)` when after_pipe).
  absl::StatusOr<ExprPtr> Filter(ExprPtr input, bool after_pipe = false) {
    const int line = Cur().line;
    if (!after_pipe && !SkipOp("|")) return Error("expected '|'");
    auto e = Make(ExprKind::kFilter, line);
    JINJA_ASSIGN_OR_RETURN(e->name, DottedName());
    e->children.push_back(std::move(input));
    if (IsOp("(")) JINJA_RETURN_IF_ERROR(Args(e.get()));
    return e;
  }

  absl::StatusOr<ExprPtr> FilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        JINJA_ASSIGN_OR_RETURN(e, Filter(std::move(e)));
      } else if (IsName("is")) {
        const int line = Cur().line;
        Next();
        auto t = Make(ExprKind::kTest, line);
        t->negated = SkipName("not");
        JINJA_ASSIGN_OR_RETURN(t->name, DottedName());
        t->children.push_back(std::move(e));
        const Token& c = Cur();
        if (IsOp("(")) {
          JINJA_RETURN_IF_ERROR(Args(t.get()));
        } else if ((c.kind == Tok::kName && c.text != "else" && c.text != "or" &&
                    c.text != "and") ||
                   c.kind == Tok::kString || c.kind == Tok::kInt || c.kind == Tok::kFloat ||
                   IsOp("[") || IsOp("{")) {
          JINJA_ASSIGN_OR_RETURN(ExprPtr arg, Primary());
          JINJA_ASSIGN_OR_RETURN(arg, Postfix(std::move(arg)));
          t->children.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        JINJA_ASSIGN_OR_RETURN(e, Call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loops_ = 0;  // for loops around the statement being parsed
};

}  // namespace

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens) { return Parser(tokens).Template(); }

}  // namespace kvguard::core::jinja
