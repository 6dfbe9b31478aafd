// core/service/prometheus_text.h: the Prometheus text exposition format (version 0.0.4), as
// /metrics writes it: one `# HELP` and `# TYPE` line per metric family, then its samples, label
// values escaped (backslash, double quote, newline).
#ifndef KVGUARD_CORE_SERVICE_PROMETHEUS_TEXT_H_
#define KVGUARD_CORE_SERVICE_PROMETHEUS_TEXT_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvguard::core {

using Labels = std::vector<std::pair<std::string, std::string>>;

class PrometheusText {
 public:
  // Family starts metric family `name` of `type` ("counter", "gauge"); its samples follow.
  void Family(std::string_view name, std::string_view type, std::string_view help);
  // Sample writes `name{labels} value` (integers without a decimal point; NaN and infinities
  // as Prometheus spells them).
  void Sample(std::string_view name, const Labels& labels, double value);
  // One is Family plus one unlabelled sample.
  void One(std::string_view name, std::string_view type, std::string_view help, double value);
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// EscapeLabelValue escapes `\`, `"` and newline as the format requires.
std::string EscapeLabelValue(std::string_view value);

// kPrometheusContentType is the Content-Type of the text format.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_SERVICE_PROMETHEUS_TEXT_H_
