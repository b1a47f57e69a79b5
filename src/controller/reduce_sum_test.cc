#include "controller/reduce_sum.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> Values(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

TEST(SumPayloadsTest, SumsFloat32ElementWise) {
  auto sum =
      SumPayloads(ReduceDtype::kFloat32, {Bytes<float>({1.0f, -2.0f, 0.5f}),
                                          Bytes<float>({2.5f, 2.0f, 0.25f}),
                                          Bytes<float>({0.5f, 1.0f, 0.25f})});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_THAT(Values<float>(*sum), ::testing::ElementsAre(4.0f, 1.0f, 1.0f));
}

TEST(SumPayloadsTest, SumsFloat64AtFullPrecision) {
  // 1 + 1e-12 is lost in float32, kept in float64.
  auto sum = SumPayloads(ReduceDtype::kFloat64, {Bytes<double>({1.0, 3.0}),
                                                 Bytes<double>({1e-12, -4.5})});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_THAT(Values<double>(*sum), ::testing::ElementsAre(1.0 + 1e-12, -1.5));
}

TEST(SumPayloadsTest, AccumulatesInTheOrderGiven) {
  // (1e8 + 1) - 1e8 == 0 in float32, while 1e8 + (1 - 1e8) would not be:
  // the payloads are added left to right, in node order, every time.
  const std::vector<std::string> payloads = {
      Bytes<float>({1e8f}), Bytes<float>({1.0f}), Bytes<float>({-1e8f})};
  auto sum = SumPayloads(ReduceDtype::kFloat32, payloads);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(Values<float>(*sum)[0], (1e8f + 1.0f) + -1e8f);
  EXPECT_EQ(*SumPayloads(ReduceDtype::kFloat32, payloads), *sum);
}

TEST(SumPayloadsTest, OnePayloadComesBackUnchanged) {
  const std::string one = Bytes<float>({3.0f, -0.0f});
  auto sum = SumPayloads(ReduceDtype::kFloat32, {one});
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, one);
  auto empty =
      SumPayloads(ReduceDtype::kFloat64, {std::string(), std::string()});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(SumPayloadsTest, RefusesMismatchedLengths) {
  auto sum = SumPayloads(ReduceDtype::kFloat32,
                         {Bytes<float>({1.0f, 2.0f}), Bytes<float>({1.0f})});
  ASSERT_FALSE(sum.ok());
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sum.status().message(), HasSubstr("payload 1 has 4 bytes"));
  EXPECT_THAT(sum.status().message(), HasSubstr("payload 0 has 8"));
}

TEST(SumPayloadsTest, RefusesPartialValuesAndNoPayload) {
  auto partial = SumPayloads(ReduceDtype::kFloat64,
                             {std::string(12, '\0'), std::string(12, '\0')});
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(partial.status().message(), HasSubstr("float64"));
  EXPECT_EQ(SumPayloads(ReduceDtype::kFloat32, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fusionrl
