// POSIX shared-memory segments as every tilecomm transport in host memory
// makes them: owner-only (0600 whatever the umask), named "/tilecomm-<pid>-<32
// random hex digits>" (unguessable; the pid lets a later job of the same user
// sweep a segment whose creator died before unlinking it), zero-filled, and
// unlinked by the creator as soon as every peer has mapped it.
#pragma once

#include <cstddef>
#include <string>

namespace tilecomm::transport {

struct Segment {
  std::string name;
  char* base = nullptr;
  size_t bytes = 0;
};

/// Creates and maps a new segment of `bytes` (zero-filled). Sweeps stale segments of this user
/// first. Throws tilecomm::Error.
Segment createSegment(size_t bytes);
/// Maps a peer's segment after checking that this user owns it and that it has `bytes`;
/// `who` names it in errors ("rank 3's segment"), `hint` is appended to a size mismatch.
Segment openSegment(const std::string& name, size_t bytes, const std::string& who, const std::string& hint = "");
/// Unmaps (does not unlink).
void unmapSegment(Segment& s);
/// Removes the segment's name (mappings stay valid).
void unlinkSegment(const std::string& name);

}  // namespace tilecomm::transport
