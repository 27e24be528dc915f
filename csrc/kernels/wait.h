// Cross-process waiting on a 32-bit word in shared memory: spin briefly, then
// yield, then sleep on a futex. Ranks may outnumber cores, so a waiter must
// give its core away quickly; every sleep is bounded so callers can check
// timeouts, aborts and peer liveness.
#pragma once

#include <atomic>
#include <cstdint>

namespace tilecomm::kernels {

/// Sleeps while *word == expected, at most timeout_us microseconds.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us);
/// Wakes every process sleeping on word.
void futexWakeAll(std::atomic<uint32_t>* word);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Escalating idle strategy. reset() after progress; idle() when nothing moved.
/// Returns true from idle() when the caller should sleep (futex) now.
///
/// Note [Spin by time]: the spin is bounded in time, not in polls. A pause costs 3 to 45 ns
/// depending on the CPU, and two ranks that the scheduler stacked on one core hand it to each
/// other only when the waiter stops spinning: every hand-off costs the whole spin.
class Backoff {
 public:
  Backoff(int64_t spin_ns, int yields) : spin_ns_(spin_ns), yields_(yields) {}
  void reset() { yielded_ = -1; }
  bool idle();

 private:
  int64_t spin_ns_;
  int yields_;
  int yielded_ = -1;  // -1: not idle yet since the last progress
  int64_t spin_until_ = 0;
};

}  // namespace tilecomm::kernels
