// The AMX int8 tile: up to 16 activation rows against a tile's 16 output rows, one TDPBSUD a group.
//
// A group's stored codes are already an AMX B operand: chunk c (64 bytes: 4 columns x 16 rows) is row c of B in
// the VNNI layout TDPBSUD reads (row i holds columns 4i..4i+3 of each of the 16 outputs). 8-bit groups are loaded
// straight from the weights; 4-, 5- and 6-bit ones are unpacked into a 512-byte buffer first (block_avx512.h, the
// AVX-512 tile's own unpacking). The activations' 32 (or 16) columns of the group, for every row of the pass, are the A
// operand (signed bytes, stride K), so C[r, n] = Σ_k q_x[r, k] · u[n, k] is the AVX-512 tile's integer sum, exact.
// Per chunk of groups (a super-block, at most 16 groups) the dot products run first, two groups in flight on
// tiles 0-2 and 3-5, their int32 results stored to a buffer; then each group's sums meet its scales in the AVX-512
// tile's own fp32 step (block_avx512.h `add_group`): the same bits, for every row count.
//
// The template parameter T is the instruction set: `Amx` the real instructions (as assembly), `TileModel` a software
// model of the same five (configure, load, zero, dot product, store) that checks the tile shapes as the hardware
// requires them; the model lets every CPU with AVX-512 VNNI test this file bit for bit (the "amxmodel" path).
// Everything here has internal linkage except pick_amx and pick_amx_model (see block_layout.h on target flags).
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "block_avx512.h"
#include "block_layout.h"

namespace ab_blocks {
namespace {


constexpr int kChunkGroups = 16;  // groups whose dot products run before their scales are applied
constexpr int kC0 = 0, kA0 = 1, kB0 = 2, kC1 = 3, kA1 = 4, kB1 = 5;  // two sets of C, A, B tiles

// The 64-byte tile configuration (palette 1): C tiles ROWS x 16 int32, A tiles ROWS x G bytes, B tiles G/4 x 64.
struct TileShapes {
  uint8_t rows[8];
  uint16_t bytes[8];
  TileShapes(int rows_c, int group) : rows{}, bytes{} {
    for (int set : {0, 3}) {
      rows[set + kC0] = uint8_t(rows_c), bytes[set + kC0] = 64;
      rows[set + kA0] = uint8_t(rows_c), bytes[set + kA0] = uint16_t(group);
      rows[set + kB0] = uint8_t(group / 4), bytes[set + kB0] = 64;
    }
  }
};

// The instructions themselves, written as assembly (the compilers' AMX intrinsics are macros that paste the tile
// number as text, which a template parameter is not; "%c" prints it as the bare number the register name needs).
struct Amx {
  static void configure(const TileShapes& shapes) {
    alignas(64) uint8_t config[64] = {};
    config[0] = 1;  // palette
    std::memcpy(config + 16, shapes.bytes, sizeof(shapes.bytes));
    std::memcpy(config + 48, shapes.rows, sizeof(shapes.rows));
    __asm__ volatile("ldtilecfg %0" ::"m"(config) : "memory");
  }
  template <int T>
  static void load(const void* base, int64_t stride) {
    __asm__ volatile("tileloadd (%1,%2,1), %%tmm%c0" ::"i"(T), "r"(base), "r"(stride) : "memory");
  }
  template <int T>
  static void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  template <int C, int A, int B>
  static void dot() {  // C += A (signed bytes) · B (unsigned bytes), TDPBSUD
    __asm__ volatile("tdpbsud %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
  template <int T>
  static void store(void* base, int64_t stride) {
    __asm__ volatile("tilestored %%tmm%c0, (%1,%2,1)" ::"i"(T), "r"(base), "r"(stride) : "memory");
  }
  static void release() { __asm__ volatile("tilerelease" ::: "memory"); }
};

// The five instructions in plain C++, on thread-local tile registers of 16 rows x 64 bytes. A shape the hardware
// would refuse (A's bytes not 4 · B's rows, C and A with different rows, C wider than B) stops the process: this
// model only runs under tests.
struct TileModel {
  struct State {
    TileShapes shapes{0, 32};
    alignas(64) uint8_t data[8][16][64];
  };
  static State& state() {
    static thread_local State s;
    return s;
  }
  static void configure(const TileShapes& shapes) {
    state().shapes = shapes;
    std::memset(state().data, 0, sizeof(state().data));
  }
  template <int T>
  static void load(const void* base, int64_t stride) {
    State& s = state();
    for (int r = 0; r < s.shapes.rows[T]; ++r)
      std::memcpy(s.data[T][r], static_cast<const uint8_t*>(base) + r * stride, s.shapes.bytes[T]);
  }
  template <int T>
  static void zero() {
    std::memset(state().data[T], 0, sizeof(state().data[T]));
  }
  template <int C, int A, int B>
  static void dot() {
    State& s = state();
    const TileShapes& t = s.shapes;
    if (t.bytes[A] != 4 * t.rows[B] || t.rows[C] != t.rows[A] || t.bytes[C] != t.bytes[B]) {
      std::fprintf(stderr, "TileModel: tile shapes the AMX instructions refuse\n");
      std::abort();
    }
    for (int m = 0; m < t.rows[C]; ++m) {
      for (int n = 0; n < t.bytes[C] / 4; ++n) {
        int32_t sum;
        std::memcpy(&sum, &s.data[C][m][4 * n], 4);
        for (int k = 0; k < t.rows[B]; ++k)
          for (int j = 0; j < 4; ++j)
            sum += int32_t(int8_t(s.data[A][m][4 * k + j])) * int32_t(s.data[B][k][4 * n + j]);
        std::memcpy(&s.data[C][m][4 * n], &sum, 4);
      }
    }
  }
  template <int T>
  static void store(void* base, int64_t stride) {
    State& s = state();
    for (int r = 0; r < s.shapes.rows[T]; ++r)
      std::memcpy(static_cast<uint8_t*>(base) + r * stride, s.data[T][r], s.shapes.bytes[T]);
  }
  static void release() {}
};

// Stored codes unpacked (block_avx512.h) into 8 rows of 64 unsigned bytes: a B operand in memory.
template <void (*UNPACK)(const uint8_t*, __m512i*)>
AB_AVX512 inline void to_buffer(const uint8_t* codes, uint8_t* out) {
  __m512i wv[8];
  UNPACK(codes, wv);
  for (int c = 0; c < 8; ++c) _mm512_store_si512(out + 64 * c, wv[c]);
}

// The integer sums of `count` groups from g0 (count even for Q6_K, whose units hold two), for ROWS activation rows:
// sums[j][r][n] = Σ_{k in group g0 + j} q_x[m0 + r, k] · u[n, k].
template <class K, class T, int ROWS>
AB_AVX512 inline void group_sums(const uint8_t* codes, const int8_t* x, int64_t k, int64_t g0, int count,
                                 int64_t prefetch, uint8_t (*unpacked)[512], int32_t (*sums)[ROWS][16]) {
  for (int j = 0; j < count; j += 2) {
    const bool second = j + 1 < count;
    const int64_t g = g0 + j;
    const uint8_t *b0, *b1 = nullptr;
    if (K::BITS == 6) {  // one unit: both groups
      const uint8_t* unit = codes + (g >> 1) * 2 * K::GROUP_BYTES;
      for (int64_t line = 0; line < 2 * K::GROUP_BYTES; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(unit + prefetch + line), _MM_HINT_T0);
      to_buffer<unpack_pair>(unit, unpacked[0]);
      b0 = unpacked[0], b1 = unpacked[0] + 256;
    } else {
      const uint8_t* group = codes + g * K::GROUP_BYTES;
      for (int64_t line = 0; line < (second ? 2 : 1) * K::GROUP_BYTES; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(group + prefetch + line), _MM_HINT_T0);
      if (K::BITS == 8) {
        b0 = group, b1 = group + K::GROUP_BYTES;
      } else {
        to_buffer<unpack_group<K::BITS>>(group, unpacked[0]);
        if (second) to_buffer<unpack_group<K::BITS>>(group + K::GROUP_BYTES, unpacked[1]);
        b0 = unpacked[0], b1 = unpacked[1];
      }
    }
    T::template zero<kC0>();
    T::template load<kA0>(x + g * K::G, k);
    T::template load<kB0>(b0, 64);
    T::template dot<kC0, kA0, kB0>();
    if (second) {
      T::template zero<kC1>();
      T::template load<kA1>(x + (g + 1) * K::G, k);
      T::template load<kB1>(b1, 64);
      T::template dot<kC1, kA1, kB1>();
    }
    T::template store<kC0>(sums[j], 64);
    if (second) T::template store<kC1>(sums[j + 1], 64);
  }
}

// One group's scales on its sums (block_avx512.h: the AVX-512 tile's own operations and order).
template <class K, int ROWS>
AB_AVX512 inline void apply_scales(const TileStreams<K>& st, const RowsAt<ROWS>& in, int64_t g,
                                   const int32_t (*isums)[16], __m512 d, __m512 dmin, __m512* acc) {
  __m512 scale, zero;
  group_scales<K>(st, g, d, dmin, scale, zero);
  for (int r = 0; r < ROWS; ++r)
    acc[r] = add_group<K, ROWS>(st, in, r, g, _mm512_load_si512(isums[r]), scale, zero, acc[r]);
}

template <class K, class T, int ROWS>
AB_AVX512 void amx_tile(const Weights& w, const Activations& a, int64_t t, int64_t m0, float* y) {
  const TileStreams<K> st(w, t);
  const RowsAt<ROWS> in(a, m0, K::G16);
  alignas(64) uint8_t unpacked[2][512];
  alignas(64) int32_t sums[kChunkGroups][ROWS][16];
  T::configure(TileShapes(ROWS, K::G));
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  const __m512 none = _mm512_setzero_ps();
  if (K::SB1) {  // a scale (and zero) per group: chunks of groups
    for (int64_t g0 = 0; g0 < st.groups; g0 += kChunkGroups) {
      const int count = int(st.groups - g0 < kChunkGroups ? st.groups - g0 : kChunkGroups);
      group_sums<K, T, ROWS>(st.codes, in.xq[0], a.k, g0, count, w.prefetch, unpacked, sums);
      for (int j = 0; j < count; ++j) {
        const int64_t g = g0 + j;
        const __m512 d = halves16(st.d + g * kTile), dmin = K::MIN ? halves16(st.dmin + g * kTile) : none;
        apply_scales<K, ROWS>(st, in, g, sums[j], d, dmin, acc);
      }
    }
  } else {  // a scale per super-block of sb groups, each group's multipliers: chunks within a super-block
    int64_t g = 0;
    for (int64_t s = 0; s < st.supers; ++s) {
      const __m512 d = halves16(st.d + s * kTile), dmin = K::MIN ? halves16(st.dmin + s * kTile) : none;
      for (int64_t j0 = 0; j0 < st.sb; j0 += kChunkGroups) {
        const int count = int(st.sb - j0 < kChunkGroups ? st.sb - j0 : kChunkGroups);
        group_sums<K, T, ROWS>(st.codes, in.xq[0], a.k, g, count, w.prefetch, unpacked, sums);
        for (int j = 0; j < count; ++j, ++g) apply_scales<K, ROWS>(st, in, g, sums[j], d, dmin, acc);
      }
    }
  }
  T::release();
  store<ROWS>(w, t, m0, acc, y);
}

template <class K, int ROWS>
AB_AVX512 void amx_real(const Weights& w, const Activations& a, int64_t t, int64_t m0, float* y) {
  amx_tile<K, Amx, ROWS>(w, a, t, m0, y);
}

template <class K, int ROWS>
AB_AVX512 void amx_modelled(const Weights& w, const Activations& a, int64_t t, int64_t m0, float* y) {
  amx_tile<K, TileModel, ROWS>(w, a, t, m0, y);
}

}  // namespace

TileFn pick_amx(int kind, int rows) { AB_KIND_TABLE_OF(AB_ROW_TABLE16, amx_real, amx_real) }
TileFn pick_amx_model(int kind, int rows) { AB_KIND_TABLE_OF(AB_ROW_TABLE16, amx_modelled, amx_modelled) }

}  // namespace ab_blocks
