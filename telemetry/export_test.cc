#include "telemetry/export.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace meshrun::telemetry {
namespace {

v1::GlobalSummary Sample() {
  v1::GlobalSummary s;
  s.set_job_id("job-1");
  s.set_step(20);
  s.set_wall_time_unix_micros(1'700'000'000'250'000);
  s.set_step_time_seconds(0.5);
  v1::TelemetryValue* loss = s.add_values();
  loss->set_name("loss");
  loss->add_values(1.25f);
  v1::TelemetryValue* sink = s.add_values();
  sink->set_name("sink_mass");
  sink->add_shape(2);
  sink->add_shape(2);
  for (float v : {0.1f, 0.2f, NAN, 0.4f}) sink->add_values(v);
  return s;
}

TEST(ExportTest, Crc32cMatchesTheCastagnoliCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(ExportTest, MalformedFormatListsTheFormats) {
  EXPECT_EQ(*ParseExportFormat("jsonl"), ExportFormat::kJsonl);
  absl::StatusOr<ExportFormat> bad = ParseExportFormat("parquet");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* word : {"parquet", "csv", "jsonl", "tensorboard"}) {
    EXPECT_NE(bad.status().message().find(word), absl::string_view::npos) << word;
  }
}

TEST(ExportTest, CsvHasOneRowPerElementWithItsIndex) {
  const std::string rows = CsvRows(Sample());
  EXPECT_EQ(rows,
            "20,1700000000250000,loss,0,,1.25,false\n"
            "20,1700000000250000,sink_mass,0,0/0,0.100000001,false\n"
            "20,1700000000250000,sink_mass,1,0/1,0.200000003,false\n"
            "20,1700000000250000,sink_mass,2,1/0,nan,false\n"
            "20,1700000000250000,sink_mass,3,1/1,0.400000006,false\n");
}

TEST(ExportTest, CsvQuotesANameThatNeedsIt) {
  v1::GlobalSummary s = Sample();
  s.mutable_values(0)->set_name("loss, \"smoothed\"");
  const std::string rows = CsvRows(s);
  EXPECT_EQ(rows.rfind("20,1700000000250000,\"loss, \"\"smoothed\"\"\",0,,1.25,false\n", 0), 0u)
      << rows;
}

TEST(ExportTest, JsonLineWritesNanAsNull) {
  const std::string line = JsonLine(Sample());
  EXPECT_NE(line.find("\"step\":20"), std::string::npos);
  EXPECT_NE(line.find("\"sink_mass\":{\"shape\":[2,2],\"values\":[0.100000001,0.200000003,null,"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.back(), '\n');
}

TEST(ExportTest, TfRecordFramesLengthAndChecksums) {
  const std::string record = TensorBoardRecord(Sample());
  ASSERT_GT(record.size(), 16u);
  uint64_t length = 0;
  std::memcpy(&length, record.data(), 8);
  ASSERT_EQ(record.size(), 8 + 4 + length + 4);
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length_crc, record.data() + 8, 4);
  std::memcpy(&data_crc, record.data() + 12 + length, 4);
  EXPECT_EQ(length_crc, MaskedCrc32c(record.substr(0, 8)));
  EXPECT_EQ(data_crc, MaskedCrc32c(record.substr(12, length)));
  // Every element is tagged by its index.
  EXPECT_NE(record.find("sink_mass/1/0"), std::string::npos);
  EXPECT_EQ(TensorBoardFileName(absl::FromUnixSeconds(1700000000), "box"),
            "events.out.tfevents.1700000000.box");
}

}  // namespace
}  // namespace meshrun::telemetry
