#include "kernels/wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace tilecomm::kernels {

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  if (timeout_us <= 0) return;
  struct timespec ts;
  ts.tv_sec = timeout_us / 1000000;
  ts.tv_nsec = (timeout_us % 1000000) * 1000;
  // Shared (not PRIVATE) futex: the word lives in memory mapped by several processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool Backoff::idle() {
  ++n_;
  if (n_ <= spins_) {
    for (int i = 0; i < 16; ++i) cpuRelax();
    return false;
  }
  if (n_ <= spins_ + yields_) {
    sched_yield();
    return false;
  }
  return true;
}

}  // namespace tilecomm::kernels
