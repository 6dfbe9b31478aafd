#include "core/service/prometheus_text.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace kvguard::core {

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PrometheusText::Family(std::string_view name, std::string_view type, std::string_view help) {
  text_.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ");
  text_.append(name).append(" ").append(type).append("\n");
}

void PrometheusText::Sample(std::string_view name, const Labels& labels, double value) {
  text_.append(name);
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&text_, i ? "," : "", labels[i].first, "=\"",
                      EscapeLabelValue(labels[i].second), "\"");
    }
    text_ += '}';
  }
  text_ += ' ';
  if (std::isnan(value)) {
    text_ += "NaN";
  } else if (std::isinf(value)) {
    text_ += value > 0 ? "+Inf" : "-Inf";
  } else if (value == std::floor(value) && std::fabs(value) < 9.0e15) {
    absl::StrAppend(&text_, static_cast<int64_t>(value));
  } else {
    absl::StrAppend(&text_, value);
  }
  text_ += '\n';
}

void PrometheusText::One(std::string_view name, std::string_view type, std::string_view help,
                         double value) {
  Family(name, type, help);
  Sample(name, {}, value);
}

}  // namespace kvguard::core
