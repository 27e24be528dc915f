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

namespace {
int64_t nowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the vDSO's: no system call
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
}  // namespace

bool Backoff::idle() {
  if (yielded_ < 0) {  // the first fruitless pass since progress: the spin starts
    yielded_ = 0;
    spin_until_ = spin_ns_ > 0 ? nowNs() + spin_ns_ : 0;
  }
  if (yielded_ == 0 && spin_until_ != 0 && nowNs() < spin_until_) {
    for (int i = 0; i < 16; ++i) cpuRelax();
    return false;
  }
  if (yielded_ < yields_) {
    ++yielded_;
    sched_yield();
    return false;
  }
  return true;
}

}  // namespace tilecomm::kernels
