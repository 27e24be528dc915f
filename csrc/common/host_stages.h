// Where a synchronous collective spends its host time, stage by stage (Note [Host stages]).
#pragma once

#include <atomic>
#include <string>
#include <utility>
#include <vector>

namespace tilecomm::host_stages {

// Note [Host stages]: an eager collective of a few kilobytes is bound by the host: the GPU's
// work takes a few microseconds, and so does the host's. To see where the host's time goes,
// a synchronous all_reduce or all_gather_into_tensor marks points on its way through the
// backend; each sample is the time from the previous mark of the same call, on the calling
// thread. The stages, in order (CPU calls skip the CUDA ones, and each then counts from the
// mark before it):
//   checked   from the backend method's entry: argument checks, and the direct kernel's closure
//   begun     CUDA: the device checks and the op's begin (device guard where needed, capture query, events)
//   issued    the Work and the engine's task made
//   turn      the engine's turn taken (issue order), the task started
//   guarded   CUDA: failure checks, the device and stream guards where needed, the wait on the previous stream
//   ready     CUDA: the path decided (peer transport ready, kernel chosen), just before the launch
//   launched  CUDA: the kernel launch
//   ended     CUDA: the end event recorded
//   done      CPU: the collective itself; then (both) the task's end and the Work completed
//   waited    the caller's wait on the Work (through torch.distributed's Python, for dist calls)
// Off by default: each mark is then one relaxed load. On (start(), from
// tilecomm.host_stages), a mark reads the steady clock; a call's samples are kept by its
// thread and added to the table under a lock once it is waited on. Asynchronous calls are not
// recorded (their task may run on the engine's thread).
enum class Stage : int { kEnter = 0, kChecked, kBegun, kIssued, kTurn, kGuarded, kReady, kLaunched, kEnded, kDone,
                         kWaited, kCount };

extern std::atomic<bool> g_on;

void markOn(Stage s);

inline void mark(Stage s) {
  if (g_on.load(std::memory_order_relaxed)) markOn(s);
}

/// This thread's call is not recorded (an asynchronous one, or one of another collective).
void drop();

/// Clears the table and starts recording; throws where it is recording already (blocks do not nest).
void start();

/// Stops recording; (stage name, its samples in microseconds in the order of the calls) for every
/// stage recorded, in the stages' order.
std::vector<std::pair<std::string, std::vector<double>>> stop();

}  // namespace tilecomm::host_stages
