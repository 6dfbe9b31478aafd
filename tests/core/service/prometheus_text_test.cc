// Tests of core/service/prometheus_text.h: the /metrics exposition format.
#include "core/service/prometheus_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvguard::core {
namespace {

TEST(PrometheusTextTest, FamiliesAndSamples) {
  PrometheusText p;
  p.Family("kvguard_x_total", "counter", "Things.");
  p.Sample("kvguard_x_total", {{"tenant", "a"}, {"reason", "tag_mismatch"}}, 3);
  p.Sample("kvguard_x_total", {}, 2.5);
  p.One("kvguard_y", "gauge", "Y.", 0);
  EXPECT_EQ(p.text(),
            "# HELP kvguard_x_total Things.\n# TYPE kvguard_x_total counter\n"
            "kvguard_x_total{tenant=\"a\",reason=\"tag_mismatch\"} 3\n"
            "kvguard_x_total 2.5\n"
            "# HELP kvguard_y Y.\n# TYPE kvguard_y gauge\nkvguard_y 0\n");
}

TEST(PrometheusTextTest, EscapesLabelValues) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  PrometheusText p;
  p.Sample("m", {{"t", "x\"y"}}, 1);
  EXPECT_EQ(p.text(), "m{t=\"x\\\"y\"} 1\n");
}

TEST(PrometheusTextTest, SpecialValues) {
  PrometheusText p;
  p.Sample("a", {}, std::numeric_limits<double>::quiet_NaN());
  p.Sample("b", {}, std::numeric_limits<double>::infinity());
  p.Sample("c", {}, -std::numeric_limits<double>::infinity());
  p.Sample("d", {}, -4);
  p.Sample("e", {}, 1e20);
  EXPECT_EQ(p.text(), "a NaN\nb +Inf\nc -Inf\nd -4\ne 1e+20\n");
}

}  // namespace
}  // namespace kvguard::core
