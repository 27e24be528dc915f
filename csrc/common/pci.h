// PCI bus ids, as CUDA (cudaDeviceGetPCIBusId: "0000:3b:00.0") and NVML ("00000000:3B:00.0")
// write them, in one form, so the GPU pairs NVML describes can be matched to the CUDA devices.
#pragma once

#include <string>

namespace tilecomm {

/// "dddd:bb:dd.f" (hex, lower case) for a PCI bus id; "" if it is not one.
std::string canonicalBusId(const std::string& id);

}  // namespace tilecomm
