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
#include <string>

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

}  // namespace cairn
