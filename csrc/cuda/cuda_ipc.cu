#include "cuda/cuda_ipc.h"

#include <cstring>

#include "common/error.h"

namespace tilecomm::cuda::ipc {

char* allocate(uint64_t bytes, cudaStream_t stream) {
  char* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, bytes, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    if (p) cudaFree(p);
    throw Error(ErrorKind::kSystem, std::string("cuda_ipc area (cudaMalloc, ") + std::to_string(bytes) +
                                        " bytes): " + cudaGetErrorString(e));
  }
  return p;
}

std::string exportHandle(char* own) {
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, own);
  if (e != cudaSuccess) throw Error(ErrorKind::kSystem, std::string("cudaIpcGetMemHandle: ") + cudaGetErrorString(e));
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

char* open(const std::string& handle, std::string& why) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    why = "published no cuda_ipc handle";
    return nullptr;
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it
    why = std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(e);
    return nullptr;
  }
  return static_cast<char*>(p);
}

void close(char* peer) { cudaIpcCloseMemHandle(peer); }

void release(char* own) { cudaFree(own); }

}  // namespace tilecomm::cuda::ipc
