// The cuda_ipc transport: GPUs of one host (or ranks sharing one GPU) that load
// and store each other's memory. Each rank cudaMallocs one area (sequence flags
// + two staging buffers) and exports it with cudaIpcGetMemHandle; the handles
// are exchanged once per group (through the c10d Store, by the caller) and the
// peers' areas are opened with cudaIpcOpenMemHandle. The transport knows no
// collective: the direct kernels (allreduce_*.cu) give the flags their meaning.
//
// Note [Flags]: a flag holds the sequence number of the last direct call whose
// phase it announces. Values only grow (the area is zeroed once, at creation,
// and never reset), so a waiter asks "flag >= my call's sequence number" and a
// stale flag can never look fresh. Phase 2 ("done reading the peers' buffers")
// exists for teardown only: a rank frees its area once every peer announced it
// for the last call (IpcTransport::drain).
//
// Note [Staging parity]: call s stages its data in buffer s % 2. A rank
// overwrites buffer s % 2 again only at call s + 2, and it starts that call
// after its kernel of call s + 1 ended, which waited for every peer to announce
// call s + 1, which every peer did after its kernel of call s ended (one stream
// runs one kernel at a time): so no peer still reads the buffer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tilecomm::cuda {

constexpr int kMaxRanks = 16;   // a larger group uses the staged path
constexpr int kMaxBlocks = 16;  // thread blocks of one direct kernel (each has its own flags)
// Flags per block: phase 0 (input staged), 1 (two_shot: reduced part staged), 2 (done reading peers).
constexpr int kPhases = 3;

/// Base addresses of every rank's area, as this process sees them (own: its pointer).
struct PeerTable {
  char* base[kMaxRanks];
};

/// Written by a kernel whose wait timed out (in mapped pinned host memory).
struct KernelError {
  unsigned int claimed;  // 0 -> 1 by the first failing block
  unsigned int ready;    // 1 once the fields below are written
  int peer;              // the rank waited for
  int block;
  unsigned long long seq;  // the direct call's sequence number
  unsigned long long waited_ns;
};

/// Byte offsets inside an area.
constexpr uint64_t kFlagBytes = 4096;  // kPhases * kMaxBlocks uint64 flags, padded
__host__ __device__ inline uint64_t* flagOf(char* base, int phase, int block) {
  return reinterpret_cast<uint64_t*>(base) + phase * kMaxBlocks + block;
}
__host__ __device__ inline char* stagingOf(char* base, uint64_t capacity, uint64_t seq) {
  return base + kFlagBytes + (seq & 1) * capacity;
}

class IpcTransport {
 public:
  /// Allocates and zeroes this rank's area on `device` (capacity: bytes per staging buffer,
  /// rounded up to 256). Throws tilecomm::Error on a CUDA failure.
  IpcTransport(int rank, int world, int device, uint64_t capacity, cudaStream_t stream);
  ~IpcTransport();
  IpcTransport(const IpcTransport&) = delete;
  IpcTransport& operator=(const IpcTransport&) = delete;

  /// The raw bytes of this area's cudaIpcMemHandle_t.
  std::string exportHandle() const;
  /// Opens every peer's area from its handle (own entry ignored). Returns "" or why it failed.
  std::string open(const std::vector<std::string>& handles);

  int rank() const { return rank_; }
  int world() const { return world_; }
  uint64_t capacity() const { return capacity_; }
  const PeerTable& peers() const { return peers_; }
  /// Sequence number of the next direct call (from 1), launched with `blocks` thread blocks.
  uint64_t nextSeq(int blocks) {
    last_blocks_ = blocks;
    return ++seq_;
  }
  /// Before the area is freed: waits (at most timeout_ms) until every peer announced that its
  /// last direct kernel stopped reading peers' buffers (phase 2 of the last call).
  void drain(int64_t timeout_ms);
  KernelError* errorForDevice() const { return err_dev_; }
  /// Sequence number of the first direct call whose wait timed out, 0 if none.
  uint64_t failedSeq() const;
  /// What failed, naming the rank waited for ("" if nothing did).
  std::string errorText() const;

 private:
  int rank_;
  int world_;
  int device_;
  uint64_t capacity_;
  uint64_t seq_ = 0;
  int last_blocks_ = 0;
  char* own_ = nullptr;
  PeerTable peers_{};
  std::vector<char*> opened_;
  KernelError* err_host_ = nullptr;
  KernelError* err_dev_ = nullptr;
};

}  // namespace tilecomm::cuda
