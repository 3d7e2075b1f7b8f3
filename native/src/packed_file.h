// cairn kernel: the packed cache file -- header, validity check and mapping, atomic write.
//
// A 4 KiB header, then the arena exactly as packed (pack_plan.cpp computes the offsets): the dense
// section (every non-expert panel, 64-byte aligned, padded to 4 KiB), then one slot per routed
// expert (key = layer * E + expert; fused w1/w3 panels then w2 panels, codes and scales), each slot
// the same 4 KiB multiple, so one aligned read loads one expert (O_DIRECT). Padding bytes are
// zero, so a streaming pack and a resident pack write the same file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cairn {

constexpr char kPackMagic[8] = {'C', 'A', 'I', 'R', 'N', 'P', 'K', '2'};
constexpr size_t kPackHeader = 4096, kPage = 4096;

struct PackHeader {
  char magic[8];
  uint64_t layout;  // hash of every panel's format, shape and place, in order
  uint64_t total;   // arena bytes
  uint64_t dense;   // dense section bytes (the expert slots start at kPackHeader + dense)
  uint64_t slot;    // bytes of one expert slot
  uint32_t fp_len;
  char fp[256];     // the model fingerprint
};

// What the packed file's bytes mean, as data: every constant the panel layout rests on, read from
// the packer's own definitions (kernels.h, model.h, this header). The header's layout key starts
// from a hash of this description, so a change to any of them makes every older file invalid (it
// is re-packed, not mapped) with no constant to bump by hand. Compute tiles (kPackM, kPackN) are
// not in it: they change how panels are read, not their bytes. `format` names what the fields
// cannot say (the order of sections and of matrices: pack_plan.cpp).
using PackLayout = std::vector<std::pair<std::string, std::string>>;  // (field, value), in order
PackLayout pack_layout();
// FNV-1a over the description's text; std::invalid_argument for an override naming no field.
uint64_t pack_layout_key(const PackLayout& layout, const std::map<std::string, std::string>& overrides = {});

uint64_t fnv(uint64_t h, uint64_t v);  // FNV-1a over v's 8 bytes
size_t round_up(size_t v, size_t a);

PackHeader make_header(const std::string& fp, uint64_t layout, uint64_t total, uint64_t dense, uint64_t slot);
// The first map_len bytes of the cached file if it matches `want` exactly, else null.
void* map_cache(const std::string& path, const PackHeader& want, size_t map_len);
bool write_at(int fd, const void* data, size_t n, uint64_t off);
// A temporary file beside path with the header written; -1 on failure.
int open_tmp(const std::string& tmp, const PackHeader& h);
// fsync, close and rename: atomic, a reader sees the old file or the whole new one.
bool finish_tmp(int fd, bool ok, const std::string& tmp, const std::string& path);
// "<path>.tmp.<pid>": the writer's pid in the name, and the writer holds an exclusive flock on it
// while writing, so a file whose lock is free and whose pid is dead is a crashed pack's.
std::string tmp_name(const std::string& path);
// Removes path's temporary files left by writers that died (a crashed pack's, the model's size).
void sweep_stale_tmps(const std::string& path);

// Packing one cache file, one process or thread at a time: an exclusive flock on "<path>.lock",
// held while packing and writing; the others wait for it, then find the finished file. The holder
// unlinks the lock file before releasing it, so none is left behind, and a waiter that then gets
// the lock on the unlinked file sees it is stale and takes the new one.
class PackLock {
 public:
  explicit PackLock(const std::string& path);  // blocks; unlocked (held() false) if the file can't be made
  ~PackLock();
  PackLock(const PackLock&) = delete;
  PackLock& operator=(const PackLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  std::string path_;
  int fd_ = -1;
};

// A shared flock on the cache file for as long as the returned handle lives (null: no such file):
// the daemon's cache trimming never removes a file a running Model uses.
std::shared_ptr<void> hold_cache(const std::string& path);

}  // namespace cairn
