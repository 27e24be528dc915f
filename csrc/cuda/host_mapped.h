// The host_mapped transport's memory (the PCIe path, for GPUs that cannot map
// each other's memory): a rank's area is a shared-memory segment of the host
// (transport/segment.h: owner-only, unguessable name, unlinked once every peer
// mapped it), registered with cudaHostRegister in every process, so each GPU
// reads and writes every rank's area through its own device pointer to the
// same host pages. The direct kernels run unchanged over it; each access
// crosses PCIe, so LL lines (data and flag in one store) suit it best.
#pragma once

#include <cstdint>
#include <string>

#include "transport/segment.h"

namespace tilecomm::cuda {

struct HostArea {
  transport::Segment seg;
  char* device = nullptr;  // the pages as the current GPU addresses them
};

/// A new zeroed area of `bytes`, registered and mapped for the current device. Throws tilecomm::Error.
HostArea createHostArea(uint64_t bytes);
/// Maps and registers a peer's area by its segment name; on failure returns an area with
/// device == nullptr and sets `why`.
HostArea openHostArea(const std::string& name, uint64_t bytes, std::string& why);
/// Unregisters and unmaps (the creator unlinks the segment itself, once every peer mapped it).
void closeHostArea(HostArea& a);

}  // namespace tilecomm::cuda
