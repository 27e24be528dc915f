#include "transport/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/error.h"

namespace tilecomm::transport {

namespace {
constexpr const char* kPrefix = "tilecomm-";

std::string randomHex(int bytes) {
  std::random_device rd;
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xff;
    s += kHex[v >> 4];
    s += kHex[v & 15];
  }
  return s;
}

// Removes segments of ours whose creator died before it could unlink them.
void sweepStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  uid_t me = geteuid();
  while (struct dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) != 0) continue;
    long pid = std::strtol(e->d_name + std::strlen(kPrefix), nullptr, 10);
    if (pid <= 0 || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::string path = std::string("/dev/shm/") + e->d_name;
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && st.st_uid == me) shm_unlink((std::string("/") + e->d_name).c_str());
  }
  closedir(dir);
}
}  // namespace

Segment createSegment(size_t bytes) {
  sweepStaleSegments();
  Segment s;
  s.bytes = bytes;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    s.name = "/" + std::string(kPrefix) + std::to_string(getpid()) + "-" + randomHex(16);
    fd = shm_open(s.name.c_str(), O_CREAT | O_EXCL | O_RDWR, S_IRUSR | S_IWUSR);
    if (fd < 0 && errno != EEXIST) throwSystemError("shm_open(" + s.name + ")");
  }
  if (fd < 0) throwSystemError("shm_open: no free segment name");
  fchmod(fd, S_IRUSR | S_IWUSR);  // owner-only whatever the umask
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(s.name.c_str());
    errno = e;
    throwSystemError("ftruncate of shared-memory segment (" + std::to_string(bytes) + " bytes)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(s.name.c_str());
    throwSystemError("mmap of shared-memory segment");
  }
  s.base = static_cast<char*>(p);
  return s;
}

Segment openSegment(const std::string& name, size_t bytes, const std::string& who, const std::string& hint) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throwSystemError("shm_open of " + who + " " + name);
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    throw Error(ErrorKind::kInvalid, who + " has the wrong owner or size" + hint);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throwSystemError("mmap of " + who);
  return Segment{name, static_cast<char*>(p), bytes};
}

void unmapSegment(Segment& s) {
  if (s.base) munmap(s.base, s.bytes);
  s.base = nullptr;
}

void unlinkSegment(const std::string& name) { shm_unlink(name.c_str()); }

}  // namespace tilecomm::transport
