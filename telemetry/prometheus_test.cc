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

TEST(HistogramTest, CountsIntoInclusiveUpperBounds) {
  Histogram h({0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 1.0, 3.0, 100.0}) h.Observe(v);
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{2, 4, 5}));  // le is inclusive
  EXPECT_EQ(h.count(), 6u);
  EXPECT_DOUBLE_EQ(h.sum(), 104.65);
  h.Observe(std::nan(""));  // counted in +Inf only
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{2, 4, 5}));
  EXPECT_EQ(h.count(), 7u);
}

TEST(PrometheusTextTest, RendersHistogramBucketsSumAndCount) {
  PrometheusText text;
  ASSERT_TRUE(text.Declare("meshrun_step_time_seconds", MetricType::kHistogram,
                           "Step times.").ok());
  Histogram a({0.25, 1});
  a.Observe(0.25);
  a.Observe(2);
  ASSERT_TRUE(text.AddHistogram("meshrun_step_time_seconds", {{"job_id", "job-1"}}, a).ok());
  ASSERT_TRUE(text.AddHistogram("meshrun_step_time_seconds", {}, Histogram({0.5})).ok());
  const std::string out = text.Render();
  EXPECT_EQ(out,
            "# HELP meshrun_step_time_seconds Step times.\n"
            "# TYPE meshrun_step_time_seconds histogram\n"
            "meshrun_step_time_seconds_bucket{job_id=\"job-1\",le=\"0.25\"} 1\n"
            "meshrun_step_time_seconds_bucket{job_id=\"job-1\",le=\"1\"} 1\n"
            "meshrun_step_time_seconds_bucket{job_id=\"job-1\",le=\"+Inf\"} 2\n"
            "meshrun_step_time_seconds_sum{job_id=\"job-1\"} 2.25\n"
            "meshrun_step_time_seconds_count{job_id=\"job-1\"} 2\n"
            "meshrun_step_time_seconds_bucket{le=\"0.5\"} 0\n"
            "meshrun_step_time_seconds_bucket{le=\"+Inf\"} 0\n"
            "meshrun_step_time_seconds_sum 0\n"
            "meshrun_step_time_seconds_count 0\n");
  EXPECT_TRUE(CheckExposition(out).ok()) << CheckExposition(out);

  // Refused: a second series with the same labels, an le label of its own, a gauge sample in
  // a histogram family, a histogram in a gauge family, a name ending in a sample suffix.
  EXPECT_EQ(text.AddHistogram("meshrun_step_time_seconds", {{"job_id", "job-1"}}, a).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.AddHistogram("meshrun_step_time_seconds", {{"le", "1"}}, a).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.Add("meshrun_step_time_seconds", {{"job_id", "job-2"}}, 1).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(text.Declare("meshrun_g", MetricType::kGauge, "g").ok());
  EXPECT_EQ(text.AddHistogram("meshrun_g", {}, a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.Declare("meshrun_h_count", MetricType::kHistogram, "h").code(),
            absl::StatusCode::kInvalidArgument);
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
      "# TYPE h histogram\nh_bucket 1\n",             // bucket without le
      "# TYPE h histogram\nh 1\n",                    // bare histogram sample
      "# TYPE h histogram\nh_total 1\n",              // not a histogram suffix
  };
  for (const char* text : bad) {
    EXPECT_EQ(CheckExposition(text).code(), absl::StatusCode::kInvalidArgument) << text;
  }
  EXPECT_TRUE(CheckExposition("# HELP a b\n# TYPE a gauge\na{x=\"1\",y=\"\\\"\"} -2.5e-3 17\n")
                  .ok());
  EXPECT_TRUE(CheckExposition("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 2\nh_count 1\n")
                  .ok());
}

}  // namespace
}  // namespace meshrun::telemetry
