// core/text/jinja/builtins.h: the filters, tests, methods and globals templates may call.
//
// The set is what real chat templates use (jinja2's builtin filters and tests as listed in
// builtins.cc, Python's str and dict methods, HuggingFace's globals `raise_exception`,
// `strftime_now`, and `tojson` as HuggingFace defines it), each with jinja2's argument names
// and defaults. Nothing here mutates a list or dict, reads files, or reaches the process; an
// unknown name is an error.
#ifndef KVGUARD_CORE_TEXT_JINJA_BUILTINS_H_
#define KVGUARD_CORE_TEXT_JINJA_BUILTINS_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/jinja/value.h"

namespace kvguard::core::jinja {

using FilterFn = absl::StatusOr<Value> (*)(Renderer&, const Value&, CallArgs&);
using TestFn = absl::StatusOr<bool> (*)(Renderer&, const Value&, CallArgs&);

// FindFilter / FindTest: the builtin of that name, or nullptr.
const FilterFn* FindFilter(absl::string_view name);
const TestFn* FindTest(absl::string_view name);

// BoundMethod: `obj.name` when it names a method of obj's Python type that templates may call
// (str.strip, dict.get, ...), as a callable; Undefined otherwise.
Value BoundMethod(const Value& obj, const std::string& name);

// Globals: range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> Globals();

}  // namespace kvguard::core::jinja

#endif  // KVGUARD_CORE_TEXT_JINJA_BUILTINS_H_
