#include "kiln/dtype.h"

#include <gtest/gtest.h>

#include <set>

#include "kiln/error.h"
#include "kiln/tensor_info.h"

namespace kiln {
namespace {

TEST(DType, EveryTypeHasASizeAndANameThatRoundTrips) {
  EXPECT_EQ(allDTypes().size(), 23u);
  std::set<std::string_view> names;
  for (DType dtype : allDTypes()) {
    EXPECT_TRUE(isValidDType(static_cast<uint8_t>(dtype)));
    EXPECT_GT(dtypeSize(dtype), 0u);
    EXPECT_EQ(dtypeFromName(dtypeName(dtype)), dtype);
    EXPECT_TRUE(names.insert(dtypeName(dtype)).second);
  }
}

TEST(DType, CodesAreOnnxTensorProtoCodes) {
  // Part of the file format: these numbers must never change.
  EXPECT_EQ(static_cast<int>(DType::kF32), 1);
  EXPECT_EQ(static_cast<int>(DType::kBool), 9);
  EXPECT_EQ(static_cast<int>(DType::kF16), 10);
  EXPECT_EQ(static_cast<int>(DType::kBF16), 16);
  EXPECT_EQ(static_cast<int>(DType::kF8E4M3), 17);
  EXPECT_EQ(static_cast<int>(DType::kF8E5M2), 19);
  EXPECT_EQ(static_cast<int>(DType::kF8E4M3FNUZ), 18);
  EXPECT_EQ(static_cast<int>(DType::kF8E5M2FNUZ), 20);
  EXPECT_EQ(static_cast<int>(DType::kU4), 21);
  EXPECT_EQ(static_cast<int>(DType::kI4), 22);
  EXPECT_EQ(static_cast<int>(DType::kF4E2M1), 23);
  EXPECT_EQ(static_cast<int>(DType::kF8E8M0), 24);
  EXPECT_EQ(static_cast<int>(DType::kU2), 25);
  EXPECT_EQ(static_cast<int>(DType::kI2), 26);
  EXPECT_FALSE(isValidDType(27));
  EXPECT_FALSE(isValidDType(0));
  EXPECT_FALSE(isValidDType(8));   // ONNX string: not a tensor storage type here
  EXPECT_FALSE(isValidDType(14));  // complex64
  EXPECT_FALSE(dtypeFromName("f128").has_value());
}

TEST(DType, SizesAndStorageOnlyTypes) {
  EXPECT_EQ(dtypeSize(DType::kF64), 8u);
  EXPECT_EQ(dtypeSize(DType::kBF16), 2u);
  EXPECT_EQ(dtypeSize(DType::kF8E5M2), 1u);
  EXPECT_TRUE(isStorageOnly(DType::kF8E4M3));
  EXPECT_FALSE(isStorageOnly(DType::kF16));
  // Sub-byte types take one byte each in memory; ONNX packs them.
  for (DType dtype : {DType::kI4, DType::kU4, DType::kF4E2M1}) {
    EXPECT_EQ(dtypeSize(dtype), 1u);
    EXPECT_EQ(dtypePackedBits(dtype), 4u);
    EXPECT_TRUE(isStorageOnly(dtype));
  }
  EXPECT_EQ(dtypePackedBits(DType::kI2), 2u);
  EXPECT_EQ(dtypePackedBits(DType::kU2), 2u);
  EXPECT_EQ(dtypePackedBits(DType::kF8E8M0), 8u);
  EXPECT_EQ(dtypePackedBits(DType::kI64), 64u);
  EXPECT_EQ(dtypeName(DType::kF8E4M3FNUZ), "f8e4m3fnuz");
  EXPECT_EQ(dtypeFromName("i4"), DType::kI4);
  EXPECT_EQ(dtypeDisplayName(DType::kF4E2M1), "F4E2M1");
}

TEST(TensorInfo, SizesAndText) {
  const TensorInfo info{DType::kF32, {2, 3}};
  EXPECT_EQ(info.numElements(), 6u);
  EXPECT_EQ(info.sizeInBytes(), 24u);
  EXPECT_EQ(info.toString(), "{ dtype: F32, sizeInBytes: 24, shape [2, 3] }");
  EXPECT_EQ((TensorInfo{DType::kI64, {}}).sizeInBytes(), 8u);  // scalar

  const TensorInfo dynamic{DType::kF16, {kDynamicDim, 128}};
  EXPECT_FALSE(dynamic.isStatic());
  EXPECT_EQ(dynamic.toString(), "{ dtype: F16, sizeInBytes: ?, shape [?, 128] }");
  EXPECT_THROW(dynamic.numElements(), UsageError);

  const TensorInfo huge{DType::kF64, {int64_t{1} << 40, int64_t{1} << 40}};
  EXPECT_THROW(huge.sizeInBytes(), UsageError);

  // A zero dimension empties the tensor, but the other dimensions must
  // still fit, in any order (issue 12: the product overflowed before
  // reaching a trailing 0 only; kernels' partial products overflowed
  // with a leading one).
  constexpr int64_t kBig = int64_t{1} << 62;
  EXPECT_THROW((TensorInfo{DType::kF32, {kBig, kBig, 0}}).numElements(), UsageError);
  EXPECT_THROW((TensorInfo{DType::kF32, {0, kBig, kBig}}).sizeInBytes(), UsageError);
  EXPECT_EQ((TensorInfo{DType::kF32, {0, kBig}}).numElements(), 0u);
  EXPECT_EQ((TensorInfo{DType::kF32, {kBig, 0}}).numElements(), 0u);
  EXPECT_THROW((TensorInfo{DType::kF32, {kBig, 0}}).sizeInBytes(), UsageError);  // 2^64 bytes of rows
  EXPECT_EQ((TensorInfo{DType::kU8, {kBig, 0}}).sizeInBytes(), 0u);
}

TEST(TensorInfo, MultiplySizesIsChecked) {
  EXPECT_EQ(multiplySizes(6, 7), 42);
  EXPECT_EQ(multiplySizes(0, INT64_MAX), 0);
  EXPECT_EQ(multiplySizes(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_EQ(multiplySizes(int64_t{1} << 32, int64_t{1} << 31), std::nullopt);
  EXPECT_EQ(multiplySizes(2, int64_t{1} << 62), std::nullopt);
  EXPECT_EQ(multiplySizes(-1, 4), std::nullopt);
}

}  // namespace
}  // namespace kiln
