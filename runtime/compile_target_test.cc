#include "runtime/compile_target.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace meshrun::runtime {
namespace {

TEST(CompileTargetTest, ParsesSlicesAndMultislice) {
  absl::StatusOr<CompileTarget> v6e8 = ParseCompileTarget("v6e-8");
  ASSERT_TRUE(v6e8.ok()) << v6e8.status();
  EXPECT_EQ(v6e8->topology_name, "v6e:2x4");
  EXPECT_EQ(v6e8->chips_per_host_bounds, (std::vector<int64_t>{2, 4, 1}));
  EXPECT_EQ(v6e8->hosts(), 1);
  EXPECT_EQ(v6e8->chip.hbm_bytes, int64_t{32} << 30);
  EXPECT_DOUBLE_EQ(v6e8->chip.peak_bf16_flops, 918e12);

  absl::StatusOr<CompileTarget> v6e16 = ParseCompileTarget("v6e-16");
  ASSERT_TRUE(v6e16.ok());
  EXPECT_EQ(v6e16->topology_name, "v6e:4x4");
  EXPECT_EQ(v6e16->hosts(), 4);  // hosts of 4 chips past 8

  absl::StatusOr<CompileTarget> two = ParseCompileTarget("2xv6e-8");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->name, "2xv6e-8");
  EXPECT_EQ(two->num_slices, 2);
  EXPECT_EQ(two->devices(), 16);
  EXPECT_EQ(two->topology_name, "v6e:2x4");
}

TEST(CompileTargetTest, RefusalsNameTheTargetAndTheForms) {
  for (const char* bad : {"v6e-12", "v7-8", "v6e", "0xv6e-8", "x-8", ""}) {
    absl::StatusOr<CompileTarget> target = ParseCompileTarget(bad);
    ASSERT_FALSE(target.ok()) << bad;
    EXPECT_EQ(target.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(target.status().message().find(absl::StrCat("\"", bad, "\"")), std::string::npos)
        << target.status();
    EXPECT_NE(target.status().message().find("v6e-8"), std::string::npos) << target.status();
  }
}

TEST(CompileTargetTest, TargetForRegisteredHosts) {
  absl::StatusOr<CompileTarget> one_host = TargetForHosts("TPU v6 lite", 1, 8, 1);
  ASSERT_TRUE(one_host.ok());
  EXPECT_EQ(one_host->name, "v6e-8");
  absl::StatusOr<CompileTarget> four_hosts = TargetForHosts("TPU v6 lite", 4, 4, 2);
  ASSERT_TRUE(four_hosts.ok());
  EXPECT_EQ(four_hosts->name, "2xv6e-16");
  EXPECT_EQ(four_hosts->chips_per_host_bounds, (std::vector<int64_t>{2, 2, 1}));
  absl::StatusOr<CompileTarget> cpu = TargetForHosts("cpu", 1, 8, 1);
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cpu.status().message().find("\"cpu\""), std::string::npos);
}

TEST(CompileTargetTest, FitNamesProgramBytesAndChip) {
  const ChipSpec chip = *ChipByGeneration("v6e");
  CompiledMemory fits{.argument_bytes = 10 << 20, .output_bytes = 10 << 20,
                      .alias_bytes = 10 << 20, .temp_bytes = 1 << 20};
  EXPECT_EQ(fits.DeviceBytes(), 11 << 20);
  EXPECT_TRUE(CheckFits("step", fits, chip).ok());
  CompiledMemory big{.argument_bytes = int64_t{20} << 30, .output_bytes = int64_t{20} << 30};
  absl::Status refused = CheckFits("step", big, chip);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("program step needs 40.00 GiB per device"), std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("a v6e chip has 32.00 GiB"), std::string::npos) << refused;
}

}  // namespace
}  // namespace meshrun::runtime
