// Entry points for fuzzers: raw bytes fed to the code that reads what peers
// wrote (tests/fuzz). Not used by the engine.
#pragma once

#include <string>

namespace tilecomm::exec {

/// Rank 0 of a two-rank shared-memory group (both in this process) publishes
/// one slot whose header and payload are `bytes`; rank 1 receives it as the
/// first slice of a 64-byte float32 all_reduce (a receive-reduce step). Returns
/// the receiver's error ("" when it accepted the slot).
std::string fuzzSlotReceive(const std::string& bytes);

}  // namespace tilecomm::exec
