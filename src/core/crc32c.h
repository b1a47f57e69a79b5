// CRC-32C (Castagnoli), the checksum of weight chunks and weight versions on
// the wire (proto/fusionrl/v1/weight.proto).
//
// Abseil 20220623 ships no CRC-32C, so this is our own: the x86-64 SSE4.2
// crc32 instruction where the CPU has it (chosen at run time; ~5x faster),
// else table-driven slicing by 8 bytes (about 1-2 GB/s per core). Reflected
// polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF: the same CRC
// as iSCSI, ext4, LevelDB and Abseil's later absl::ComputeCrc32c, so any of
// those can check our numbers.
//
// Thread safety: pure functions over constant tables; safe from any thread.
#ifndef FUSIONRL_CORE_CRC32C_H_
#define FUSIONRL_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace fusionrl {

// The CRC-32C of the bytes whose CRC-32C is `crc`, followed by `data[0, n)`.
// Start from 0 (the CRC of no bytes), so that
//   Crc32cExtend(Crc32cExtend(0, a, na), b, nb) == Crc32c(a ++ b).
// REQUIRES: `data` points at `n` readable bytes (any pointer when n == 0).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// The CRC-32C of A ++ B, given crc_a = CRC-32C(A), crc_b = CRC-32C(B) and
// len_b = B's length, without the bytes (zlib's crc32_combine, in
// O(log len_b) 32x32 bit-matrix steps: microseconds). Lets a receiver check
// each chunk's CRC and the whole version's CRC with one pass over the data.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

namespace internal {
// The table-driven Crc32cExtend, which Crc32cExtend uses where the CPU has
// no CRC-32C instruction (exposed for tests and benchmarks).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
// Whether Crc32cExtend uses the CPU's instruction (x86-64 with SSE4.2).
bool Crc32cHasHardwarePath();
}  // namespace internal

// The CRC-32C of `data`. Crc32c("123456789") == 0xE3069283.
inline uint32_t Crc32c(absl::string_view data) {
  return Crc32cExtend(0, data.data(), data.size());
}

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_CRC32C_H_
