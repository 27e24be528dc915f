#include "exec/fuzz.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "exec/executor.h"

namespace tilecomm::exec {

using transport::Link;

std::string fuzzSlotReceive(const std::string& bytes) {
  const transport::ShmConfig cfg{2, 256};
  transport::Transport a(0, 2, cfg, transport::TcpConfig{}), b(1, 2, cfg, transport::TcpConfig{});
  const std::vector<std::string> names{a.shm().segmentName(), b.shm().segmentName()};
  const std::vector<int64_t> pids(2, getpid());
  const std::vector<std::string> addrs(2);
  const std::vector<int> ports(2, 0);
  const std::string token(transport::kTokenBytes, '\0');
  a.connect({Link::kSelf, Link::kShm}, names, pids, addrs, ports, token, 1000);
  b.connect({Link::kShm, Link::kSelf}, names, pids, addrs, ports, token, 1000);

  transport::Slot* s = a.trySendSlot(transport::kCollLane, 1);
  size_t head = std::min(bytes.size(), sizeof(transport::SlotHeader));
  std::memcpy(&s->hdr, bytes.data(), head);
  std::memcpy(transport::ShmTransport::payload(s), bytes.data() + head,
              std::min<size_t>(bytes.size() - head, cfg.slot_bytes));
  a.commitSend(transport::kCollLane, 1, 0);

  Executor ex(b, WaitConfig{0, 0, 1000});
  CollDesc desc;
  desc.seq = 1;
  desc.count = 16;
  desc.coll = Coll::kAllReduce;
  desc.dtype = DType::kFloat32;
  desc.op = RedOp::kSum;
  std::vector<char> buf(64);
  std::vector<Step> steps{Step{StepKind::kRecvReduce, 0, buf.data(), buf.size()}};
  try {
    ex.runRound(steps, desc, DType::kFloat32, RedOp::kSum, Clock::now() + std::chrono::milliseconds(20), 20);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tilecomm::exec
