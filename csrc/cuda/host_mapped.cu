#include "cuda/host_mapped.h"

#include <cuda_runtime_api.h>

#include "common/error.h"

namespace tilecomm::cuda {

namespace {

// Registers seg for the current device; "" or why it failed (the segment stays mapped).
std::string registerArea(HostArea& a) {
  cudaError_t e = cudaHostRegister(a.seg.base, a.seg.bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaHostRegister: ") + cudaGetErrorString(e);
  }
  void* d = nullptr;
  e = cudaHostGetDevicePointer(&d, a.seg.base, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaHostUnregister(a.seg.base);
    return std::string("cudaHostGetDevicePointer: ") + cudaGetErrorString(e);
  }
  a.device = static_cast<char*>(d);
  return "";
}

}  // namespace

HostArea createHostArea(uint64_t bytes) {
  HostArea a;
  a.seg = transport::createSegment(bytes);  // zero-filled
  std::string why = registerArea(a);
  if (!why.empty()) {
    transport::unlinkSegment(a.seg.name);
    transport::unmapSegment(a.seg);
    throw Error(ErrorKind::kSystem, "host_mapped area (" + std::to_string(bytes) + " bytes): " + why);
  }
  return a;
}

HostArea openHostArea(const std::string& name, uint64_t bytes, std::string& why) {
  HostArea a;
  try {
    a.seg = transport::openSegment(name, bytes, "its host_mapped area");
  } catch (const std::exception& e) {
    why = e.what();
    return HostArea{};
  }
  why = registerArea(a);
  if (!why.empty()) transport::unmapSegment(a.seg);
  return a;
}

void closeHostArea(HostArea& a) {
  if (a.device) cudaHostUnregister(a.seg.base);
  a.device = nullptr;
  transport::unmapSegment(a.seg);
}

}  // namespace tilecomm::cuda
