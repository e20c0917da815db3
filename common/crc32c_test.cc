#include "common/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace meshrun {
namespace {

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);       // the check value of CRC-32C
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // and of ones
}

TEST(Crc32c, ContinuesAcrossPiecesAndSeesEveryBit) {
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 2654435761u >> 24);
  const uint32_t whole = Crc32c(data);
  // Split at odd places so both the 8-byte and the byte loops run on each side.
  uint32_t pieces = Crc32c(absl::string_view(data).substr(0, 13));
  pieces = Crc32c(absl::string_view(data).substr(13, 100003), pieces);
  pieces = Crc32c(absl::string_view(data).substr(100016), pieces);
  EXPECT_EQ(pieces, whole);
  for (size_t at : {size_t{0}, size_t{7}, data.size() / 2, data.size() - 1}) {
    std::string flipped = data;
    flipped[at] ^= 0x10;
    EXPECT_NE(Crc32c(flipped), whole) << "bit flip at " << at;
  }
}

}  // namespace
}  // namespace meshrun
