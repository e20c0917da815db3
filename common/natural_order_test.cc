#include "common/natural_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace meshrun {
namespace {

TEST(NaturalOrderTest, NumbersCompareByValue) {
  EXPECT_TRUE(NaturalLess("worker-2", "worker-10"));
  EXPECT_FALSE(NaturalLess("worker-10", "worker-2"));
  EXPECT_TRUE(NaturalLess("w-9", "w-10"));
  EXPECT_TRUE(NaturalLess("tpu-1-w-10", "tpu-2-w-0"));  // the first number decides first
  EXPECT_TRUE(NaturalLess("tpu-1-w-2", "tpu-1-w-10"));
}

TEST(NaturalOrderTest, IsAStrictWeakOrder) {
  EXPECT_FALSE(NaturalLess("host-a", "host-a"));
  EXPECT_FALSE(NaturalLess("", ""));
  EXPECT_TRUE(NaturalLess("", "a"));
  EXPECT_TRUE(NaturalLess("host", "host-0"));        // a prefix first
  EXPECT_TRUE(NaturalLess("host-a", "host-b"));      // letters as bytes
  EXPECT_TRUE(NaturalLess("w-7", "w-007"));          // equal value: the shorter run first
  EXPECT_FALSE(NaturalLess("w-007", "w-7"));
  EXPECT_TRUE(NaturalLess("w-99999999999999999999998", "w-99999999999999999999999"));
}

TEST(NaturalOrderTest, SortsTheWayAnOperatorReads) {
  std::vector<std::string> names = {"worker-10", "worker-2", "worker-1", "worker-0",
                                    "worker-11", "worker-3", "coordinator"};
  std::mt19937 rng(7);
  std::shuffle(names.begin(), names.end(), rng);
  NaturalSort(names);
  EXPECT_EQ(names, (std::vector<std::string>{"coordinator", "worker-0", "worker-1", "worker-2",
                                             "worker-3", "worker-10", "worker-11"}));
  std::map<std::string, int, NaturalOrder> by_host = {{"w-10", 1}, {"w-2", 2}};
  EXPECT_EQ(by_host.begin()->first, "w-2");
}

}  // namespace
}  // namespace meshrun
