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
class Backoff {
 public:
  Backoff(int spins, int yields) : spins_(spins), yields_(yields) {}
  void reset() { n_ = 0; }
  bool idle();

 private:
  int spins_;
  int yields_;
  int n_ = 0;
};

}  // namespace tilecomm::kernels
