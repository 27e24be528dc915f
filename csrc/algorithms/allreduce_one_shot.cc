// One-shot all-reduce over mailbox rounds (Note [Mailbox] in transport/shm.h):
// every rank posts its buffer, and once all have, combines the p contributions
// in rank order (0, 1, .., p-1) straight from the peers' mailboxes, so every
// rank computes the same expression and ends bitwise identical. Messages larger
// than a mailbox take one round per mailbox-sized piece.
// Cost: 1 round per piece, (p-1) x the buffer read and reduced per rank, and a
// single wake-up per round however many peers there are. Wins for small
// messages, above all when ranks outnumber cores.
#include <algorithm>
#include <cstring>

#include "algorithms/direct.h"
#include "kernels/reduce.h"

namespace tilecomm::algo {

void allreduceOneShot(const DirectArgs& a) {
  const size_t elem = dtypeSize(a.dtype);
  const size_t nbytes = a.count * elem;
  const size_t piece = a.exec.mailboxBytes() / elem * elem;
  size_t off = 0;
  do {  // a zero-byte call still takes one round, so every rank checks the others' descriptors
    const size_t len = std::min(piece, nbytes - off);
    uint64_t round = a.exec.exchangeMailbox(a.desc, a.buf + off, len, off, nbytes, a.deadline, a.timeout_ms);
    std::memcpy(a.buf + off, a.exec.peerMailbox(0, round, a.desc, len, off, nbytes), len);
    for (int r = 1; r < a.world; ++r)
      kernels::reduceInto(a.buf + off, a.exec.peerMailbox(r, round, a.desc, len, off, nbytes), len / elem, a.dtype,
                          a.op);
    off += len;
  } while (off < nbytes);
}

}  // namespace tilecomm::algo
