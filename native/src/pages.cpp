// cairn kernel: page groups of the append-only state (cairn/pages.h).
#include "cairn/pages.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "cairn/kernels.h"
#include "cairn/model.h"

namespace cairn {

static_assert(kPanel == 16, "PageLayout::Array's panel layout is the packed micro-kernel's");

namespace {
std::atomic<int64_t> g_groups{0}, g_bytes{0};
std::atomic<uint64_t> g_next_id{1};
}  // namespace

PageGroup::PageGroup(int64_t n, size_t narrays)
    : id(g_next_id.fetch_add(1)), nfloats(n), data(new float[(size_t)std::max<int64_t>(n, 1)]), fill(narrays, 0) {
  g_groups.fetch_add(1);
  g_bytes.fetch_add(4 * n);
}

PageGroup::~PageGroup() {
  g_groups.fetch_sub(1);
  g_bytes.fetch_sub(4 * nfloats);
}

PagePoolStats page_pool_stats() { return {g_groups.load(), g_bytes.load()}; }

std::shared_ptr<const PageLayout> make_page_layout(const Config& c, int64_t page_tokens) {
  int64_t step = 1;
  for (int l = 0; l < c.n_layers; ++l) {
    if (c.layer_types[l] == AttnType::CSA) step = std::lcm(step, (int64_t)c.csa_rate);
    if (c.layer_types[l] == AttnType::HCA) step = std::lcm(step, (int64_t)c.hca_rate);
  }
  int64_t P = page_tokens;
  if (P == 0) P = (DEFAULT_PAGE_TOKENS + step - 1) / step * step;
  if (P < 1 || P % step != 0 || P > (int64_t)1 << 24)
    throw std::invalid_argument("page_tokens must be a positive multiple of every compress rate (" +
                                std::to_string(step) + " for this model) up to 2^24, got " +
                                std::to_string(page_tokens));
  auto L = std::make_shared<PageLayout>();
  L->page_tokens = P;
  L->arrays.resize(2 * (size_t)c.n_layers);
  int64_t off = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    auto put = [&](int k, int rate, int dim) {
      PageLayout::Array& a = L->arrays[2 * l + k];
      a.off = off;
      a.dim = dim;
      a.rows = (int)(P / rate);
      a.panels = k == 1 && a.rows % kPanel == 0;  // the indexer's keys, scored in place
      off += (int64_t)a.rows * dim;
    };
    if (c.layer_types[l] == AttnType::HCA) put(0, c.hca_rate, c.Dh);
    if (c.layer_types[l] == AttnType::CSA) {
      put(0, c.csa_rate, c.Dh);
      put(1, c.csa_rate, c.Di);
    }
  }
  L->group_floats = off;
  return L;
}

int64_t PageLayout::used_floats(int64_t group, int64_t n) const {
  int64_t f = 0;
  for (const Array& a : arrays) {
    if (!a.rows) continue;
    const int64_t rate = page_tokens / a.rows;
    f += std::clamp<int64_t>(n / rate - group * a.rows, 0, a.rows) * a.dim;
  }
  return f;
}

// A private copy of g: only the rows written (in the panel layout, the whole panels that hold
// them, zero lanes included), so untouched memory stays untouched.
static std::shared_ptr<PageGroup> copy_group(const PageLayout& L, const PageGroup& g) {
  auto c = std::make_shared<PageGroup>(L.group_floats, L.arrays.size());
  for (size_t a = 0; a < L.arrays.size(); ++a) {
    const PageLayout::Array& ar = L.arrays[a];
    if (!g.fill[a]) continue;
    std::memcpy(c->data.get() + ar.off, g.data.get() + ar.off, sizeof(float) * (size_t)ar.span(g.fill[a]));
    c->fill[a] = g.fill[a];
  }
  return c;
}

void PageTable::write_row(int arr, int64_t i, const float* src) {
  const PageLayout::Array& a = layout->arrays[arr];
  const size_t g = (size_t)(i / a.rows);
  if (g > groups.size()) throw std::logic_error("page table: rows must be appended in order");
  if (g == groups.size()) groups.push_back(std::make_shared<PageGroup>(layout->group_floats, layout->arrays.size()));
  std::shared_ptr<PageGroup>& grp = groups[g];
  // Another table or snapshot holds this group: write into a private copy instead. use_count can
  // only fall concurrently (holders elsewhere let go), never rise: only this table hands it out.
  if (grp.use_count() > 1) grp = copy_group(*layout, *grp);
  const int r = (int)(i % a.rows);
  grp->fill[arr] = std::max(grp->fill[arr], r + 1);
  float* base = grp->data.get() + a.off;
  if (!a.panels) {
    std::memcpy(base + (int64_t)r * a.dim, src, sizeof(float) * a.dim);
    return;
  }
  float* panel = base + a.at(r - r % kPanel);  // [dim][16]
  if (r % kPanel == 0) std::fill(panel, panel + (size_t)a.dim * kPanel, 0.f);  // lanes past the fill: zero
  for (int c = 0; c < a.dim; ++c) panel[(size_t)c * kPanel + r % kPanel] = src[c];
}

void PageTable::drop_last_row(int arr, int64_t i) {
  const PageLayout::Array& a = layout->arrays[arr];
  const size_t g = (size_t)(i / a.rows);
  if (g >= groups.size() || groups[g]->fill[arr] != (int)(i % a.rows) + 1)
    throw std::logic_error("page table: only the last row of an array can be dropped");
  std::shared_ptr<PageGroup>& grp = groups[g];
  if (grp.use_count() > 1) grp = copy_group(*layout, *grp);
  const int r = (int)(i % a.rows);
  grp->fill[arr] = r;
  if (a.panels)  // the lane goes back to zero, as if never written (a group's bytes are its rows')
    for (int c = 0; c < a.dim; ++c) grp->data[(size_t)(a.off + a.at(r) + (int64_t)c * kPanel)] = 0.f;
  while (!groups.empty() && std::all_of(groups.back()->fill.begin(), groups.back()->fill.end(), [](int f) { return f == 0; }))
    groups.pop_back();
}

void PageTable::unshare() {
  for (auto& grp : groups) grp = copy_group(*layout, *grp);
}

}  // namespace cairn
