// The cuda_ipc transport's memory: a rank's area in its GPU's memory
// (cudaMalloc), exported with cudaIpcGetMemHandle and opened by every peer of
// the host with cudaIpcOpenMemHandle. Needs peer access between the GPUs (or
// one GPU shared by the ranks). What the area holds: peer_transport.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace tilecomm::cuda::ipc {

/// A zeroed area of `bytes` on the current device. Throws tilecomm::Error.
char* allocate(uint64_t bytes, cudaStream_t stream);
/// The raw bytes of the area's cudaIpcMemHandle_t.
std::string exportHandle(char* own);
/// Opens a peer's area from its handle; nullptr and `why` when it cannot.
char* open(const std::string& handle, std::string& why);
void close(char* peer);
void release(char* own);

}  // namespace tilecomm::cuda::ipc
