// The AVX-512 VNNI tile: the 16 output rows of a tile in one register, u8 x s8 dot products of 4 columns.
// One instantiation per format kind and row count (block_layout.h): no division, no branch on the format in
// the loop; super-blocks outside, their groups inside; the scales are converted once per super-block.
// Everything here has internal linkage except pick_avx512 (see block_layout.h on target flags).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "block_avx512.h"
#include "block_layout.h"

namespace ab_blocks {
namespace {

AB_AVX512 inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <class K, int ROWS>
AB_AVX512 void tile(const Weights& w, const Activations& a, int64_t t, int64_t m0, float* y) {
  constexpr int kChunks = K::BITS == 8 ? K::G / 4 : 8;  // dot products of 4 columns per group
  constexpr int64_t kGroupBytes = K::GROUP_BYTES;
  const TileStreams<K> st(w, t);
  const int64_t pf = w.prefetch;
  const RowsAt<ROWS> in(a, m0, K::G16);
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  int64_t g = 0;
  for (int64_t s = 0; s < st.supers; ++s) {
    const __m512 d = halves16(st.d + s * kTile);
    __m512 dmin = _mm512_setzero_ps();
    if (K::MIN) dmin = halves16(st.dmin + s * kTile);
    _mm_prefetch(reinterpret_cast<const char*>(st.d + s * kTile) + pf / 8, _MM_HINT_T0);
    for (int64_t j = 0; j < st.sb; ++j, ++g) {
      const uint8_t* tg = st.codes + g * kGroupBytes;
      for (int64_t line = 0; line < kGroupBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(tg + pf + line), _MM_HINT_T0);
      __m512i wv[kChunks];
      if (K::BITS != 8) {
        unpack_group<K::BITS>(tg, wv);
      } else {
        for (int c = 0; c < kChunks; ++c) wv[c] = _mm512_loadu_si512(tg + 64 * c);
      }
      __m512 scale, zero;
      group_scales<K>(st, g, d, dmin, scale, zero);
      for (int r = 0; r < ROWS; ++r) {
        const int8_t* x = in.xq[r] + g * K::G;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int c = 0; c < kChunks; c += 2) {
          s0 = _mm512_dpbusd_epi32(s0, wv[c], broadcast4(x + 4 * c));
          s1 = _mm512_dpbusd_epi32(s1, wv[c + 1], broadcast4(x + 4 * c + 4));
        }
        acc[r] = add_group<K, ROWS>(st, in, r, g, _mm512_add_epi32(s0, s1), scale, zero, acc[r]);
      }
    }
  }
  store<ROWS>(w, t, m0, acc, y);
}

// Q6_K in six bits (kind KQ6_K): a unit holds two 16-column groups, one activation block, as the 4-bit layout
// holds a 32-column group (group 2p in the low nibbles, 2p + 1 in the high ones), then a 128-byte plane of the
// high two bits (byte i of half h: bits 2c, 2c + 1 are q's bits 4, 5 in byte i of that half's chunk c). The
// same integers, scales and fp32 operations in the same order as the widened kind K8G16: the same bits.
template <class K, int ROWS>
AB_AVX512 void pair_tile(const Weights& w, const Activations& a, int64_t t, int64_t m0, float* y) {
  constexpr int64_t kUnitBytes = 2 * K::GROUP_BYTES;
  const int64_t groups = w.groups, pairs = w.sb / 2, pf = w.prefetch;
  const uint8_t* codes = w.codes + t * groups * K::GROUP_BYTES;
  const uint16_t* dp = w.d + t * w.supers * kTile;
  const int8_t* scp = w.sc + t * groups * kTile;
  const RowsAt<ROWS> in(a, m0, true);
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  int64_t p = 0;
  for (int64_t s = 0; s < w.supers; ++s) {
    const __m512 d = halves16(dp + s * kTile);
    _mm_prefetch(reinterpret_cast<const char*>(dp + s * kTile) + pf / 8, _MM_HINT_T0);
    for (int64_t j = 0; j < pairs; ++j, ++p) {
      const uint8_t* unit = codes + p * kUnitBytes;
      for (int64_t line = 0; line < kUnitBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(unit + pf + line), _MM_HINT_T0);
      __m512i wv[8];
      unpack_pair(unit, wv);
      const __m512 scale[2] = {_mm512_mul_ps(d, bytes16(scp + 2 * p * kTile)),
                               _mm512_mul_ps(d, bytes16(scp + (2 * p + 1) * kTile))};
      for (int r = 0; r < ROWS; ++r) {
        const int8_t* x = in.xq[r] + p * kBlock;
        const __m512 dxr = _mm512_set1_ps(in.dx[r][p]);
        for (int h = 0; h < 2; ++h) {
          const int8_t* xh = x + 16 * h;
          __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[4 * h], broadcast4(xh));
          __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[4 * h + 1], broadcast4(xh + 4));
          s0 = _mm512_dpbusd_epi32(s0, wv[4 * h + 2], broadcast4(xh + 8));
          s1 = _mm512_dpbusd_epi32(s1, wv[4 * h + 3], broadcast4(xh + 12));
          const __m512i isum =
              _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(w.offset * in.sums[r][2 * p + h]));
          acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(scale[h], dxr), _mm512_cvtepi32_ps(isum)));
        }
      }
    }
  }
  store<ROWS>(w, t, m0, acc, y);
}

}  // namespace

TileFn pick_avx512(int kind, int rows) { AB_KIND_TABLE(tile, pair_tile) }

}  // namespace ab_blocks
