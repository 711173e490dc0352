// Which instruction sets this CPU runs, read from CPUID and XGETBV at run time, each on its own flags.
//
// Instruction sets are not a ladder: AVX-512 VNNI does not imply AVX-VNNI (Zen 4, Cascade Lake, Ice Lake have
// the first without the second), and AMX comes with both on Sapphire Rapids but with neither on other CPUs.
// A path runs only where every flag it needs is reported, and the OS saves the registers it uses (XCR0).
// AMX also needs Linux's permission for the process's tile state (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+):
// asked once here, and a CPU whose OS refuses it does not run the AMX path.
// The feature bits below are in the order of extension.py's FEATURES (the names /proc/cpuinfo gives them).
#pragma once

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace ab_cpu {

enum Feature : int64_t {
  kAvx2 = 1 << 0,
  kFma = 1 << 1,
  kF16c = 1 << 2,
  kAvxVnniFlag = 1 << 3,
  kAvx512F = 1 << 4,
  kAvx512Bw = 1 << 5,
  kAvx512Vl = 1 << 6,
  kAvx512VnniFlag = 1 << 7,
  kAmxTile = 1 << 8,
  kAmxInt8 = 1 << 9,
};

// The kernels' paths, in the order of extension.py's ISA_NAMES (not an order of implication). kAmxPath: AMX int8
// tiles for passes of many rows, the AVX-512 VNNI tile for fewer (block_kernels.cpp); kAmxModelPath: the same AMX
// tile code on a software model of the tile instructions (block_tile_amx.cpp), for tests on CPUs without AMX.
// Neither is chosen unless forced: on the one AMX Xeon measured, the AVX-512 VNNI tile was as fast or faster
// below 16 rows (benchmarks/RESULTS.md, "AMX").
enum Path : int64_t {
  kScalarPath = 0,
  kAvx2Path = 1,
  kAvxVnniPath = 2,
  kAvx512VnniPath = 3,
  kAmxPath = 4,
  kAmxModelPath = 5,
  kPaths = 6
};

inline const char* path_name(int64_t path) {
  static const char* names[] = {"scalar", "avx2", "avxvnni", "avx512vnni", "amx", "amxmodel"};
  return path >= 0 && path < kPaths ? names[path] : "unknown";
}

// Linux's permission to use the tile data state in this process (granted once, for every thread).
inline bool tile_permission() {
#ifdef __linux__
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
  return false;
#endif
}

inline uint64_t xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

// The feature bits of this CPU (0 where CPUID or the OS's register saving says no).
inline int64_t read_features() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave) return 0;
  const uint64_t x = xcr0();
  const bool ymm = (x & 0x6) == 0x6, zmm = ymm && (x & 0xE0) == 0xE0, tiles = (x & (3ull << 17)) == (3ull << 17);
  int64_t out = 0;
  if (ymm && fma) out |= kFma;
  if (ymm && f16c) out |= kF16c;
  if (__get_cpuid_max(0, nullptr) < 7) return out;
  __cpuid_count(7, 0, a, b, c, d);
  if (ymm && (b & (1u << 5))) out |= kAvx2;
  if (zmm && (b & (1u << 16))) out |= kAvx512F;
  if (zmm && (b & (1u << 30))) out |= kAvx512Bw;
  if (zmm && (b & (1u << 31))) out |= kAvx512Vl;
  if (zmm && (c & (1u << 11))) out |= kAvx512VnniFlag;
  const bool amx = tiles && (d & (1u << 24)) && (d & (1u << 25)) && tile_permission();
  if (amx) out |= kAmxTile | kAmxInt8;
  if (a >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    if (ymm && (a & (1u << 4))) out |= kAvxVnniFlag;
  }
  return out;
}

inline int64_t features() {
  static const int64_t cached = read_features();
  return cached;
}

inline bool has(int64_t features, int64_t wanted) { return (features & wanted) == wanted; }

// Bit p set: path p runs on a CPU with these features.
inline int64_t paths_for(int64_t f) {
  const int64_t base = kAvx2 | kFma | kF16c;
  int64_t out = int64_t(1) << kScalarPath;
  if (has(f, base)) out |= int64_t(1) << kAvx2Path;
  if (has(f, base | kAvxVnniFlag)) out |= int64_t(1) << kAvxVnniPath;
  const int64_t avx512 = base | kAvx512F | kAvx512Bw | kAvx512Vl | kAvx512VnniFlag;
  if (has(f, avx512)) out |= (int64_t(1) << kAvx512VnniPath) | (int64_t(1) << kAmxModelPath);
  if (has(f, avx512 | kAmxTile | kAmxInt8)) out |= int64_t(1) << kAmxPath;
  return out;
}

// The path used when none is forced: the first runnable of AVX-512 VNNI, AVX-VNNI, AVX2, scalar.
inline int64_t best_of(int64_t paths) {
  for (int64_t p : {kAvx512VnniPath, kAvxVnniPath, kAvx2Path}) if (paths & (int64_t(1) << p)) return p;
  return kScalarPath;
}

inline int64_t paths() {
  static const int64_t cached = paths_for(features());
  return cached;
}

inline std::string path_list(int64_t paths) {
  std::string out;
  for (int64_t p = 0; p < kPaths; ++p)
    if (paths & (int64_t(1) << p)) out += (out.empty() ? "" : ", ") + std::string(path_name(p));
  return out;
}

}  // namespace ab_cpu
