// cairn kernel: the packed cache file's header, validity check, mapping and atomic write
// (the layout is described in packed_file.h).
#include "packed_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cairn/kernels.h"
#include "cairn/model.h"
#include "codecs/codec.h"

namespace cairn {

PackLayout pack_layout() {
  auto n = [](long v) { return std::to_string(v); };
  std::string words;  // each GGUF codec's word-interleaved byte range (codecs/codec.h, lane_byte)
  for (const BlockCodec* c : all_codecs())
    if (c->words_hi > c->words_lo)
      words += std::string(words.empty() ? "" : ", ") + c->name + " " + n(c->words_lo) + "-" + n(c->words_hi);
  return {
      {"format", "CAIRNPK: header, dense section, then one slot per routed expert in key order (layer * E + e)"},
      {"magic", std::string(kPackMagic, sizeof kPackMagic)},
      {"header_bytes", n(kPackHeader)},
      {"header_struct_bytes", n(sizeof(PackHeader))},
      {"panel_rows", n(kPanel)},
      {"panel_order", "[ceil(N/panel_rows)][K][panel_rows]"},
      {"fp32_lane_bytes", n(sizeof(float))},
      {"bf16_lane_bytes", n(sizeof(uint16_t))},
      {"e4m3_code_bytes_per_k", n(qstride(QFmt::E4M3))},
      {"e2m1_code_bytes_per_k", n(qstride(QFmt::E2M1))},
      {"e2m1_nibbles", "lanes 2j (low), 2j+1 (high) in byte j"},
      {"e4m3_scale_group", n(qgroup(QFmt::E4M3))},
      {"e2m1_scale_group", n(qgroup(QFmt::E2M1))},
      {"e4m3_scale_bias", n(qbias(QFmt::E4M3))},
      {"e2m1_scale_bias", n(qbias(QFmt::E2M1))},
      {"scale_order", "[ceil(N/panel_rows)][ceil(K/group)][panel_rows]"},
      {"fused_gate_up", "gate panel q, up panel q, ..."},
      {"ggml_panels", "[ceil(N/panel_rows)][K/block][block_bytes][panel_rows]: GGUF blocks byte-interleaved, no scales"},
      {"ggml_panel_words", "[words][panel_rows][4] in these byte ranges of a block: " + words},
      {"matrix_align", n(64)},
      {"scales_align", n(64)},
      {"dense_align", n(kPage)},
      {"expert_slot_align", n(kPage)},
      {"expert_slot", "fused w1/w3, then w2"},
  };
}

uint64_t pack_layout_key(const PackLayout& layout, const std::map<std::string, std::string>& overrides) {
  for (const auto& o : overrides) {
    bool known = false;
    for (const auto& f : layout) known = known || f.first == o.first;
    if (!known) throw std::invalid_argument("packed layout has no field '" + o.first + "'");
  }
  uint64_t h = 14695981039346656037ull;
  auto text = [&](const std::string& s) {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // a separator byte no field holds: ("ab","c") != ("a","bc")
  };
  for (const auto& f : layout) {
    auto o = overrides.find(f.first);
    text(f.first);
    text(o == overrides.end() ? f.second : o->second);
  }
  return h;
}

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
  flock(fd, LOCK_EX);  // while it is written (released by close, or by the writer's death)
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

std::string tmp_name(const std::string& path) { return path + ".tmp." + std::to_string(getpid()); }

void sweep_stale_tmps(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string prefix = path.substr(slash == std::string::npos ? 0 : slash + 1) + ".tmp.";
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0 || name.size() == prefix.size()) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const std::string file = (slash == std::string::npos ? "" : dir) + name;
    const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    // a live writer holds the lock; the pid guards the instant between its open and its flock
    const pid_t pid = (pid_t)std::stol(digits);
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && kill(pid, 0) != 0 && errno == ESRCH) unlink(file.c_str());
    close(fd);
  }
  closedir(d);
}

PackLock::PackLock(const std::string& path) : path_(path + ".lock") {
  for (;;) {
    const int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;  // e.g. a read-only directory: pack unlocked (its write fails as before)
    if (flock(fd, LOCK_EX) != 0) {
      close(fd);
      if (errno == EINTR) continue;
      return;
    }
    struct stat a{}, b{};
    if (fstat(fd, &a) == 0 && stat(path_.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
      fd_ = fd;
      return;
    }
    close(fd);  // the holder before us unlinked this one: take the new file
  }
}

PackLock::~PackLock() {
  if (fd_ < 0) return;
  unlink(path_.c_str());
  close(fd_);
}

std::shared_ptr<void> hold_cache(const std::string& path) {
  if (path.empty()) return nullptr;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  flock(fd, LOCK_SH);
  return std::shared_ptr<void>(new int(fd), [](void* p) {
    close(*(int*)p);
    delete (int*)p;
  });
}

}  // namespace cairn
