#include "common/host_stages.h"

#include <chrono>
#include <cmath>
#include <mutex>
#include <stdexcept>

namespace tilecomm::host_stages {

std::atomic<bool> g_on{false};

namespace {
constexpr int kStages = static_cast<int>(Stage::kCount);
const char* const kNames[kStages] = {"enter", "checked", "begun",  "issued", "turn",   "guarded",
                                     "ready", "launched", "ended", "done",   "waited"};

std::mutex g_mu;
std::vector<double> g_samples[kStages];

struct Call {
  bool armed = false;
  std::chrono::steady_clock::time_point last;
  double us[kStages];
};
thread_local Call t_call;
}  // namespace

void markOn(Stage s) {
  const auto now = std::chrono::steady_clock::now();
  Call& c = t_call;
  const int i = static_cast<int>(s);
  if (s == Stage::kEnter) {
    c.armed = true;
    for (double& u : c.us) u = NAN;
  } else if (c.armed) {
    c.us[i] = std::chrono::duration<double, std::micro>(now - c.last).count();
  }
  if (c.armed && s == Stage::kWaited) {
    c.armed = false;
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_on.load(std::memory_order_relaxed))
      for (int k = 1; k < kStages; ++k)
        if (!std::isnan(c.us[k])) g_samples[k].push_back(c.us[k]);
  }
  c.last = std::chrono::steady_clock::now();  // the bookkeeping above is not counted
}

void drop() { t_call.armed = false; }

void start() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_on.load(std::memory_order_relaxed))
    throw std::runtime_error("tilecomm.host_stages: already recording in this process (blocks do not nest)");
  for (auto& v : g_samples) v.clear();
  g_on.store(true, std::memory_order_relaxed);
}

std::vector<std::pair<std::string, std::vector<double>>> stop() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_on.store(false, std::memory_order_relaxed);
  std::vector<std::pair<std::string, std::vector<double>>> out;
  for (int k = 1; k < kStages; ++k)
    if (!g_samples[k].empty()) out.emplace_back(kNames[k], std::move(g_samples[k]));
  for (auto& v : g_samples) v.clear();
  return out;
}

}  // namespace tilecomm::host_stages
