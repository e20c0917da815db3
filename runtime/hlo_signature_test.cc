// limits (issue 16): the compiled program's parameters, read from its optimized HLO module.
#include "runtime/hlo_signature.h"

#include <gtest/gtest.h>

#include <string>

namespace meshrun::runtime {
namespace {

std::string Bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

std::string LengthDelimited(int field, const std::string& payload) {
  return Bytes({field << 3 | 2, static_cast<int>(payload.size())}) + payload;
}

// HloModuleProto{name: "m", host_program_shape: {parameters: [f32[3,4], s32[5]], result: ...}}.
std::string Module() {
  const std::string f32 = Bytes({0x10, 11}) + LengthDelimited(3, Bytes({3, 4}));
  const std::string s32 = Bytes({0x10, 4}) + LengthDelimited(3, Bytes({5}));
  const std::string tuple = Bytes({0x10, 13});
  const std::string program_shape =
      LengthDelimited(1, f32) + LengthDelimited(1, s32) + LengthDelimited(2, tuple);
  return LengthDelimited(1, "m") + LengthDelimited(4, program_shape) + Bytes({0x28, 7});
}

TEST(HloSignatureTest, ReadsTheEntryParameters) {
  absl::StatusOr<std::vector<ArrayShape>> shapes = EntryParameterShapes(Module(), "hlo");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ(ToString((*shapes)[0]), "f32[3,4]");
  EXPECT_EQ(ToString((*shapes)[1]), "s32[5]");
  // Wrapped as HloModuleProtoWithConfig.
  shapes = EntryParameterShapes(LengthDelimited(1, Module()), "hlo_with_config");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(shapes->size(), 2u);
}

TEST(HloSignatureTest, ChecksDeclaredInputsNamingTheFirstThatDiffers) {
  const std::vector<ArrayShape> params = *EntryParameterShapes(Module(), "hlo");
  ProgramSignature good{{{"x", {DType::kF32, {3, 4}}}, {"n", {DType::kS32, {5}}}}, {}};
  EXPECT_TRUE(CheckDeclaredInputs(params, good).ok());
  ProgramSignature bad = good;
  bad.inputs[1].shape.dims = {6};
  const absl::Status s = CheckDeclaredInputs(params, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("input 1 'n': the job declares s32[6] per device, the compiled "
                             "program takes s32[5]"),
            std::string::npos)
      << s;
  bad.inputs.pop_back();
  EXPECT_NE(CheckDeclaredInputs(params, bad).message().find("declares 1 inputs"),
            std::string::npos);
}

TEST(HloSignatureTest, MalformedBytesAreRefusedNotRead) {
  const std::string module = Module();
  for (size_t cut = 1; cut < module.size(); ++cut) {
    // Every truncation either parses (a prefix that ends on a field boundary) or is refused;
    // none reads past the end.
    (void)EntryParameterShapes(module.substr(0, cut), "hlo");
  }
  EXPECT_FALSE(EntryParameterShapes(Bytes({0x22, 0x7f}), "hlo").ok());  // length past the end
  EXPECT_FALSE(EntryParameterShapes(Bytes({0x0f}), "hlo").ok());        // wire type 7
  EXPECT_FALSE(EntryParameterShapes(std::string(12, '\xff'), "hlo").ok());  // endless varint
  EXPECT_FALSE(EntryParameterShapes(Module(), "mlir").ok());
  EXPECT_FALSE(EntryParameterShapes(LengthDelimited(1, "m"), "hlo").ok());  // no program shape
  const std::string tuple_param =
      LengthDelimited(4, LengthDelimited(1, Bytes({0x10, 13})));
  EXPECT_EQ(EntryParameterShapes(tuple_param, "hlo").status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace meshrun::runtime
