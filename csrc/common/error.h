// Errors raised by the engine. The backend maps each kind to the matching
// Python exception (communication failures become DistBackendError).
#pragma once

#include <stdexcept>
#include <string>

namespace tilecomm {

enum class ErrorKind { kInvalid, kDesync, kPeerFailed, kTimeout, kAborted, kSystem };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] void throwSystemError(const std::string& what);  // appends strerror(errno)

}  // namespace tilecomm
