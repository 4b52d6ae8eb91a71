#include "core/byte_io.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(ByteIo, RoundTripsEveryPrimitive) {
  ByteWriter out;
  out.u8(7);
  out.u16(0xBEEF);
  out.u32(0xDEADBEEF);
  out.u64(0x0123456789ABCDEFull);
  out.i64(-5);
  out.string("héllo");
  ByteCursor in(out.bytes(), "mem", 1000);
  EXPECT_EQ(in.u8("a"), 7);
  EXPECT_EQ(in.u16("b"), 0xBEEF);
  EXPECT_EQ(in.u32("c"), 0xDEADBEEFu);
  EXPECT_EQ(in.u64("d"), 0x0123456789ABCDEFull);
  EXPECT_EQ(in.i64("e"), -5);
  EXPECT_EQ(in.string("f"), "héllo");
  EXPECT_EQ(in.remaining(), 0u);
}

TEST(ByteIo, EncodingIsLittleEndian) {
  ByteWriter out;
  out.u32(0x04030201);
  ASSERT_EQ(out.bytes().size(), 4u);
  EXPECT_EQ(out.bytes()[0], std::byte{1});
  EXPECT_EQ(out.bytes()[3], std::byte{4});
}

TEST(ByteIo, ReadingPastTheEndThrowsWithTheAbsoluteOffset) {
  ByteWriter out;
  out.u16(1);
  ByteCursor in(out.bytes(), "file.kiln", 4096);
  try {
    in.u32("field_x");
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.source(), "file.kiln");
    EXPECT_EQ(e.offset(), 4096u);
    EXPECT_NE(std::string(e.what()).find("field_x needs 4 bytes but only 2 remain"), std::string::npos) << e.what();
  }
}

TEST(ByteIo, StringLongerThanItsSectionIsRefused) {
  ByteWriter out;
  out.u32(1000);  // claims 1000 bytes, has 3
  out.raw("abc", 3);
  ByteCursor in(out.bytes(), "m", 0);
  EXPECT_THROW(in.string("name"), FormatError);
}

TEST(ByteIo, ListCountThatCannotFitIsRefusedBeforeAnyAllocation) {
  ByteWriter out;
  out.u32(0xFFFFFFFF);
  out.u64(0);
  ByteCursor in(out.bytes(), "m", 0);
  EXPECT_THROW(in.count("items", 4), FormatError);
}

TEST(ByteIo, BooleanMustBeZeroOrOne) {
  ByteWriter out;
  out.u8(2);
  ByteCursor in(out.bytes(), "m", 0);
  EXPECT_THROW(in.boolean("flag"), FormatError);
}

}  // namespace
}  // namespace kiln
