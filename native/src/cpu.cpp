// cairn._cpu: what this CPU and its OS let the kernel run, asked of the compiler's own check
// (cairn/isa.py turns it into a kernel level). Built without -march, so it loads on any CPU Python does.
//
// __builtin_cpu_supports("x86-64-vN") (GCC >= 12, clang >= 16) tests the whole psABI level as
// -march=x86-64-vN compiles for it. XCR0 is read here as well: a CPU can have AVX-512 while the OS
// does not save its registers (a hypervisor or kernel option masking it), and then its
// instructions fault. libgcc also consults XCR0, but the check is cheap and says so explicitly.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0 (the register state the OS saves and restores), 0 when the OS does not expose XGETBV.
unsigned long long xcr0() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}

std::vector<std::string> features() {
  __builtin_cpu_init();
  std::vector<std::string> out;
  if (__builtin_cpu_supports("x86-64-v2")) out.push_back("x86-64-v2");
  if (__builtin_cpu_supports("x86-64-v3")) out.push_back("x86-64-v3");
  if (__builtin_cpu_supports("x86-64-v4")) out.push_back("x86-64-v4");
  const unsigned long long x = xcr0();
  if ((x & 0x6) == 0x6) out.push_back("os-ymm");            // SSE and AVX state
  if ((x & 0xe6) == 0xe6) out.push_back("os-zmm");          // and opmask, ZMM0-15 upper, ZMM16-31
  return out;
}
#else
std::vector<std::string> features() { return {}; }  // no x86 levels: the kernel's base build
#endif

}  // namespace

PYBIND11_MODULE(_cpu, m) {
  m.doc() = "what this CPU and its OS support, as the compiler checks it (cairn/isa.py)";
  m.def("features", &features,
        R"(The x86-64 psABI levels this CPU runs ("x86-64-v2" .. "x86-64-v4", __builtin_cpu_supports) and the
register state its OS saves ("os-ymm": AVX, "os-zmm": AVX-512, from XCR0). Empty off x86.)");
}
