// cairn kernel: the packed cache file's header, validity check, mapping and atomic write
// (the layout is described in packed_file.h).
#include "packed_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace cairn {

uint64_t fnv(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h;
}

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

PackHeader make_header(const std::string& fp, uint64_t layout, uint64_t total, uint64_t dense, uint64_t slot) {
  PackHeader h{};
  std::memcpy(h.magic, kPackMagic, 8);
  h.layout = layout;
  h.total = total;
  h.dense = dense;
  h.slot = slot;
  h.fp_len = (uint32_t)std::min<size_t>(fp.size(), sizeof h.fp);
  std::memcpy(h.fp, fp.data(), h.fp_len);
  return h;
}

void* map_cache(const std::string& path, const PackHeader& want, size_t map_len) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  PackHeader got{};
  struct stat st{};
  void* map = nullptr;
  if (pread(fd, &got, sizeof got, 0) == (ssize_t)sizeof got && std::memcmp(&got, &want, sizeof got) == 0 &&
      fstat(fd, &st) == 0 && (uint64_t)st.st_size == kPackHeader + want.total) {
    map = mmap(nullptr, map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) map = nullptr;
  }
  close(fd);
  return map;
}

bool write_at(int fd, const void* data, size_t n, uint64_t off) {
  for (size_t done = 0; done < n;) {
    const ssize_t w = pwrite(fd, (const char*)data + done, std::min<size_t>(n - done, 1u << 30), (off_t)(off + done));
    if (w <= 0) return false;
    done += (size_t)w;
  }
  return true;
}

int open_tmp(const std::string& tmp, const PackHeader& h) {
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  std::vector<char> head(kPackHeader, 0);
  std::memcpy(head.data(), &h, sizeof h);
  if (!write_at(fd, head.data(), head.size(), 0)) {
    close(fd);
    unlink(tmp.c_str());
    return -1;
  }
  return fd;
}

bool finish_tmp(int fd, bool ok, const std::string& tmp, const std::string& path) {
  ok = ok && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  ok = ok && rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) unlink(tmp.c_str());
  return ok;
}

}  // namespace cairn
