// CRC-32C (Castagnoli, the checksum of iSCSI and ext4): a cheap check that bytes were not
// corrupted on their way, not an authenticity check. Executable chunks carry one in plaintext
// transfers (bench/README.md, "Integrity of executable transfers").
//
// Uses the SSE4.2 crc32 instruction when the CPU has it (~8 bytes per cycle-triple, several
// GB/s), a table otherwise; both give the same values.
// Thread-safety: safe to call concurrently.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace meshrun {

// The CRC-32C of `data`, continuing from `crc` (the value of the bytes before it; 0 to start).
// Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

}  // namespace meshrun
