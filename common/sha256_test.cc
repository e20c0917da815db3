#include "common/sha256.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace meshrun {
namespace {

// FIPS 180-2 test vectors.
TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, IncrementalMatchesOneShotAndResets) {
  Sha256 hasher;
  hasher.Update("a");
  hasher.Update("bc");
  EXPECT_EQ(hasher.HexDigest(), Sha256Hex("abc"));
  hasher.Update("abc");
  EXPECT_EQ(hasher.HexDigest(), Sha256Hex("abc"));
}

TEST(Sha256Test, FileMatchesContents) {
  const std::string path = ::testing::TempDir() + "/sha256_test_file";
  std::string contents(3 << 20, 'x');  // spans several read buffers
  contents[12345] = 'y';
  std::ofstream(path, std::ios::binary) << contents;
  auto digest = Sha256File(path);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, Sha256Hex(contents));
  std::remove(path.c_str());
}

TEST(Sha256Test, MissingFileNamesPath) {
  auto digest = Sha256File("/nonexistent/meshrun/file");
  EXPECT_EQ(digest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(digest.status().message().find("/nonexistent/meshrun/file"), absl::string_view::npos);
}

}  // namespace
}  // namespace meshrun
