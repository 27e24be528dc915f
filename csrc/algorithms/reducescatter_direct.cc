// Direct reduce-scatter: block j goes straight to rank j, which combines the p
// copies in rank order. Cost: 1 round, (p-1)/p of the buffer sent and reduced
// per rank. Wins for small messages, where one exchange beats p-1 ring rounds.
#include "algorithms/direct.h"

namespace tilecomm::algo {

void reducescatterDirect(const DirectArgs& a) { scatterReduce(a); }

}  // namespace tilecomm::algo
