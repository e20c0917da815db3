#include "telemetry/prometheus.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace meshrun::telemetry {
namespace {

TEST(PrometheusTextTest, RendersFamiliesWithEscapedLabelsAndSpecialValues) {
  PrometheusText text;
  ASSERT_TRUE(text.Declare("meshrun_loss", MetricType::kGauge, "Latest loss.\nSecond line").ok());
  ASSERT_TRUE(text.Declare("meshrun_steps_total", MetricType::kCounter, "Steps run.").ok());
  ASSERT_TRUE(text.Add("meshrun_loss", {{"job", "a\"b\\c\nd"}}, 1.5).ok());
  ASSERT_TRUE(text.Add("meshrun_loss", {{"job", "nan"}}, std::nan("")).ok());
  ASSERT_TRUE(
      text.Add("meshrun_loss", {{"job", "inf"}}, std::numeric_limits<double>::infinity()).ok());
  ASSERT_TRUE(text.Add("meshrun_loss", {{"job", "short"}}, 0.1).ok());
  ASSERT_TRUE(text.Add("meshrun_steps_total", {}, 42).ok());
  const std::string out = text.Render();
  EXPECT_EQ(out,
            "# HELP meshrun_loss Latest loss.\\nSecond line\n"
            "# TYPE meshrun_loss gauge\n"
            "meshrun_loss{job=\"a\\\"b\\\\c\\nd\"} 1.5\n"
            "meshrun_loss{job=\"nan\"} NaN\n"
            "meshrun_loss{job=\"inf\"} +Inf\n"
            "meshrun_loss{job=\"short\"} 0.1\n"
            "# HELP meshrun_steps_total Steps run.\n"
            "# TYPE meshrun_steps_total counter\n"
            "meshrun_steps_total 42\n");
  EXPECT_TRUE(CheckExposition(out).ok()) << CheckExposition(out);
}

TEST(PrometheusTextTest, RefusesWhatWouldBreakTheFormat) {
  PrometheusText text;
  EXPECT_EQ(text.Declare("9bad", MetricType::kGauge, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.Declare("meshrun_steps", MetricType::kCounter, "").code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(text.Declare("meshrun_x", MetricType::kGauge, "x").ok());
  EXPECT_EQ(text.Declare("meshrun_x", MetricType::kCounter, "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.Add("meshrun_undeclared", {}, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.Add("meshrun_x", {{"bad-label", "v"}}, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.Add("meshrun_x", {{"a", "1"}, {"a", "2"}}, 1).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(text.Add("meshrun_x", {{"a", "1"}}, 1).ok());
  absl::Status twice = text.Add("meshrun_x", {{"a", "1"}}, 2);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("twice"), std::string::npos) << twice;
  EXPECT_TRUE(CheckExposition(text.Render()).ok());
}

TEST(CheckExpositionTest, CatchesInvalidLines) {
  const char* bad[] = {
      "# TYPE a gauge\na 1",                           // no final newline
      "# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n",  // duplicate series
      "# TYPE a gauge\nb 1\n",                         // sample outside its family
      "# TYPE a_count counter\na_count 1\n",           // counter without _total
      "# TYPE a gauge\na{x=1} 1\n",                    // unquoted label value
      "# TYPE a gauge\na{x=\"\\q\"} 1\n",              // bad escape
      "# TYPE a gauge\na one\n",                       // bad value
      "# TYPE a gauge\n\na 1\n",                       // blank line
      "# TYPE a gauge\na 1\n# TYPE a gauge\na{b=\"c\"} 1\n",  // family twice
      "# TYPE a-b gauge\n",                            // illegal name
      "# TYPE a summary\n",                            // type we never write
  };
  for (const char* text : bad) {
    EXPECT_EQ(CheckExposition(text).code(), absl::StatusCode::kInvalidArgument) << text;
  }
  EXPECT_TRUE(CheckExposition("# HELP a b\n# TYPE a gauge\na{x=\"1\",y=\"\\\"\"} -2.5e-3 17\n")
                  .ok());
}

}  // namespace
}  // namespace meshrun::telemetry
