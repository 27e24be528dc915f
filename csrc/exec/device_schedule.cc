#include "exec/device_schedule.h"

#include <algorithm>

#include "exec/schedule.h"

namespace tilecomm::exec {

static_assert(static_cast<uint8_t>(StepKind::kSend) == kDeviceSend &&
                  static_cast<uint8_t>(StepKind::kRecvCopy) == kDeviceRecvCopy &&
                  static_cast<uint8_t>(StepKind::kRecvReduce) == kDeviceRecvReduce,
              "device steps carry StepKind values");

std::optional<DeviceProgram> deviceProgram(const Algorithm& algo, int rank, int world, int root, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<DeviceProgram> {
    if (why) *why = algo.name + ": " + w;
    return std::nullopt;
  };
  if (algo.direct) return fail("run by the engine itself, it has no schedule");
  if (world < 1 || rank < 0 || rank >= world) return fail("rank outside the group");
  const int shift = algo.rooted ? root : 0;
  if (shift < 0 || shift >= world) return fail("root outside the group");
  const size_t index = algo.rooted ? static_cast<size_t>((rank - shift + world) % world) : 0;
  if (index >= algo.schedules.size()) return fail("no schedule for this rank");
  const Schedule& s = algo.schedules[index];
  DeviceProgram p;
  p.nchunks = s.nchunks;
  if (s.nchunks == 0) return fail("a schedule of zero chunks");
  if (s.round_end.size() > static_cast<size_t>(kDeviceMaxRounds))
    return fail(std::to_string(s.round_end.size()) + " rounds (at most " + std::to_string(kDeviceMaxRounds) + ")");
  uint32_t begin = 0;
  for (uint32_t end : s.round_end) {
    const uint32_t n = end - begin;
    if (end < begin || end > s.ops.size()) return fail("malformed round");
    if (n > static_cast<uint32_t>(kDeviceMaxLanes))
      return fail("a round of " + std::to_string(n) + " steps (at most " + std::to_string(kDeviceMaxLanes) + ")");
    for (uint32_t i = begin; i < end; ++i) {
      const SchedOp& o = s.ops[i];
      const int peer = (o.peer + shift) % world;
      if (o.peer < 0 || o.peer >= world || peer == rank) return fail("a step with an invalid peer");
      if (o.lo > o.hi || o.hi > s.nchunks) return fail("a step outside the chunks");
      const bool sends = o.kind == StepKind::kSend;
      for (uint32_t j = begin; j < i; ++j)
        if ((s.ops[j].kind == StepKind::kSend) == sends && (s.ops[j].peer + shift) % world == peer)
          return fail(std::string("a round with two ") + (sends ? "sends to" : "receives from") + " one peer");
      if (o.dep >= 0) {
        if (static_cast<uint32_t>(o.dep) >= n || begin + o.dep == i) return fail("a dep outside its round");
        const SchedOp& d = s.ops[begin + o.dep];
        if ((d.kind == StepKind::kSend) == sends || d.lo != o.lo || d.hi != o.hi)
          return fail("a dep that is not the other direction over the same chunks");
      }
      p.steps.push_back(DeviceStep{static_cast<uint8_t>(o.kind), static_cast<int8_t>(o.dep),
                                   static_cast<int16_t>(peer), o.lo, o.hi});
    }
    p.lanes = std::max(p.lanes, n);
    p.round_end.push_back(end);
    begin = end;
  }
  return p;
}

}  // namespace tilecomm::exec
