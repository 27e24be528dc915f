// A schedule flattened for the GPU's schedule executor (cuda/schedule_executor.h): one rank's
// rounds with every peer resolved to a group rank, and the check that the executor can walk
// them. Host code only (no CUDA): the CPU build compiles and tests it too.
//
// The executor gives each step of a round its own thread blocks ("lanes") and one FIFO per
// (peer, direction), so a round may not hold two sends to one peer or two receives from one
// peer; a step's dep must name another step of its round, of the other direction, over the same
// chunks (its slices then line up with the step's own).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tilecomm::exec {

struct Algorithm;

/// DeviceStep::kind: StepKind's values (exec/executor.h), which this header does not include.
enum DeviceStepKind : uint8_t { kDeviceSend = 0, kDeviceRecvCopy = 1, kDeviceRecvReduce = 2 };

struct DeviceStep {
  uint8_t kind;   // DeviceStepKind
  int8_t dep;     // lane of the step this one is bounded by, or -1
  int16_t peer;   // group rank
  uint32_t lo, hi;  // chunk range
};

struct DeviceProgram {
  uint32_t nchunks = 1;
  uint32_t lanes = 0;                // most steps in one round
  std::vector<uint32_t> round_end;   // steps of round k are [round_end[k-1], round_end[k])
  std::vector<DeviceStep> steps;
};

constexpr int kDeviceMaxLanes = 32;     // steps of one round
constexpr int kDeviceMaxRounds = 4095;  // rounds of one schedule

/// Rank `rank`'s program of `algo` in a group of `world` (rooted: for `root`), or nullopt with
/// *why saying what the executor cannot walk. Direct algorithms have no schedule: nullopt.
std::optional<DeviceProgram> deviceProgram(const Algorithm& algo, int rank, int world, int root, std::string* why);

}  // namespace tilecomm::exec
