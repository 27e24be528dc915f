#include "common/pci.h"

#include <cstdio>

namespace tilecomm {

namespace {

// Parses hex digits of s[pos..) up to `stop` (or the end when stop is 0) into v; at most `digits`.
bool hexField(const std::string& s, size_t& pos, char stop, size_t digits, unsigned& v) {
  size_t n = 0;
  v = 0;
  for (; pos < s.size() && s[pos] != stop; ++pos, ++n) {
    const char c = s[pos];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0 || n >= digits) return false;
    v = v * 16 + static_cast<unsigned>(d);
  }
  if (n == 0 || (stop != 0 && pos == s.size())) return false;
  if (stop != 0) ++pos;  // past the separator
  return true;
}

}  // namespace

std::string canonicalBusId(const std::string& id) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  size_t pos = 0;
  if (!hexField(id, pos, ':', 8, dom) || !hexField(id, pos, ':', 2, bus) || !hexField(id, pos, '.', 2, dev) ||
      !hexField(id, pos, 0, 1, fn))
    return "";
  if (dom > 0xffff || dev > 0x1f || fn > 0x7) return "";
  char out[32];
  std::snprintf(out, sizeof(out), "%04x:%02x:%02x.%x", dom, bus, dev, fn);
  return out;
}

}  // namespace tilecomm
