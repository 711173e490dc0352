// The AVX-512 VNNI tile: the 16 output rows of a tile in one register, u8 x s8 dot products of 4 columns.
// One instantiation per format kind and row count (block_layout.h): no division, no branch on the format in
// the loop; super-blocks outside, their groups inside; the scales are converted once per super-block.
// Everything here has internal linkage except pick_avx512 (see block_layout.h on target flags).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "block_layout.h"

namespace ab_blocks {
namespace {

#define AB_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,avx2,fma")))

AB_AVX512 inline __m512 halves16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

AB_AVX512 inline __m512 bytes16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

AB_AVX512 inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int ROWS>
AB_AVX512 inline void store(const Weights& w, int64_t t, int64_t m0, const __m512* acc, float* y) {
  const int64_t valid = w.n - t * kTile;
  const __mmask16 mask = valid >= kTile ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  for (int r = 0; r < ROWS; ++r) _mm512_mask_storeu_ps(y + (m0 + r) * w.n + t * kTile, mask, acc[r]);
}

template <class K, int ROWS>
AB_AVX512 void tile(const Weights& w, const Activations& a, int64_t t, int64_t m0, float* y) {
  constexpr int kChunks = K::BITS == 8 ? K::G / 4 : 8;  // dot products of 4 columns per group
  constexpr int64_t kGroupBytes = K::GROUP_BYTES;
  const int64_t groups = w.groups, supers = K::SB1 ? w.groups : w.supers, sb = K::SB1 ? 1 : w.sb;
  const int64_t pf = w.prefetch;
  const uint8_t* codes = w.codes + t * groups * kGroupBytes;
  const uint16_t* dp = w.d + t * supers * kTile;
  const uint16_t* mp = K::MIN ? w.dmin + t * supers * kTile : nullptr;
  const int8_t* scp = K::SC ? w.sc + t * groups * kTile : nullptr;
  const int8_t* mnp = K::MN ? w.mn + t * groups * kTile : nullptr;
  const int32_t correction = K::BITS == 8 ? 128 : w.offset;
  const RowsAt<ROWS> in(a, m0, K::G16);
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
  int64_t g = 0;
  for (int64_t s = 0; s < supers; ++s) {
    const __m512 d = halves16(dp + s * kTile);
    __m512 dmin = _mm512_setzero_ps();
    if (K::MIN) dmin = halves16(mp + s * kTile);
    _mm_prefetch(reinterpret_cast<const char*>(dp + s * kTile) + pf / 8, _MM_HINT_T0);
    for (int64_t j = 0; j < sb; ++j, ++g) {
      const uint8_t* tg = codes + g * kGroupBytes;
      for (int64_t line = 0; line < kGroupBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(tg + pf + line), _MM_HINT_T0);
      __m512i wv[kChunks];
      if (K::BITS != 8) {
        for (int c = 0; c < 4; ++c) {
          const __m512i packed = _mm512_loadu_si512(tg + 64 * c);
          wv[c] = _mm512_and_si512(packed, low);
          wv[c + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
        }
        if (K::BITS == 5) {  // the plane: bit i of mask c is the fifth bit of byte i of chunk c (q = nibble + 16)
          for (int c = 0; c < 8; ++c) {
            uint64_t bits;
            std::memcpy(&bits, tg + 256 + 8 * c, 8);
            wv[c] = _mm512_mask_add_epi8(wv[c], _cvtu64_mask64(bits), wv[c], fifth);
          }
        }
      } else {
        for (int c = 0; c < kChunks; ++c) wv[c] = _mm512_loadu_si512(tg + 64 * c);
      }
      __m512 scale = d;
      if (K::SC) scale = _mm512_mul_ps(d, bytes16(scp + g * kTile));
      __m512 zero = dmin;
      if (K::MN) zero = _mm512_mul_ps(dmin, bytes16(mnp + g * kTile));
      const int64_t b = K::G16 ? g >> 1 : g;
      for (int r = 0; r < ROWS; ++r) {
        const int8_t* x = in.xq[r] + g * K::G;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int c = 0; c < kChunks; c += 2) {
          s0 = _mm512_dpbusd_epi32(s0, wv[c], broadcast4(x + 4 * c));
          s1 = _mm512_dpbusd_epi32(s1, wv[c + 1], broadcast4(x + 4 * c + 4));
        }
        __m512i isum = _mm512_add_epi32(s0, s1);
        if (K::BITS == 8 || K::OFF) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(correction * in.sums[r][g]));
        const __m512 term = _mm512_mul_ps(_mm512_mul_ps(scale, _mm512_set1_ps(in.dx[r][b])), _mm512_cvtepi32_ps(isum));
        acc[r] = _mm512_add_ps(acc[r], term);
        if (K::MIN) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(zero, _mm512_set1_ps(in.zx[r][b])));
      }
    }
  }
  store<ROWS>(w, t, m0, acc, y);
}

// Q6_K in six bits (kind KQ6_K): a unit holds two 16-column groups, one activation block, as the 4-bit layout
// holds a 32-column group (group 2p in the low nibbles, 2p + 1 in the high ones), then a 128-byte plane of the
// high two bits (byte i of half h: bits 2c, 2c + 1 are q's bits 4, 5 in byte i of that half's chunk c). The
// same integers, scales and fp32 operations in the same order as the widened kind K8G16: the same bits.
template <int C>
AB_AVX512 inline __m512i high_bits(__m512i plane) {  // chunk C's two bits moved to bits 4-5 of each byte
  const __m512i moved = C < 2 ? _mm512_slli_epi16(plane, 4 - 2 * C) : _mm512_srli_epi16(plane, 2 * C - 4);
  return _mm512_and_si512(moved, _mm512_set1_epi8(0x30));
}

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
  const __m512i low = _mm512_set1_epi8(0x0F);
  int64_t p = 0;
  for (int64_t s = 0; s < w.supers; ++s) {
    const __m512 d = halves16(dp + s * kTile);
    _mm_prefetch(reinterpret_cast<const char*>(dp + s * kTile) + pf / 8, _MM_HINT_T0);
    for (int64_t j = 0; j < pairs; ++j, ++p) {
      const uint8_t* unit = codes + p * kUnitBytes;
      for (int64_t line = 0; line < kUnitBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(unit + pf + line), _MM_HINT_T0);
      const __m512i plane0 = _mm512_loadu_si512(unit + 256), plane1 = _mm512_loadu_si512(unit + 320);
      __m512i wv[8];
      const __m512i packed0 = _mm512_loadu_si512(unit), packed1 = _mm512_loadu_si512(unit + 64);
      const __m512i packed2 = _mm512_loadu_si512(unit + 128), packed3 = _mm512_loadu_si512(unit + 192);
      wv[0] = _mm512_or_si512(_mm512_and_si512(packed0, low), high_bits<0>(plane0));
      wv[1] = _mm512_or_si512(_mm512_and_si512(packed1, low), high_bits<1>(plane0));
      wv[2] = _mm512_or_si512(_mm512_and_si512(packed2, low), high_bits<2>(plane0));
      wv[3] = _mm512_or_si512(_mm512_and_si512(packed3, low), high_bits<3>(plane0));
      wv[4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(packed0, 4), low), high_bits<0>(plane1));
      wv[5] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(packed1, 4), low), high_bits<1>(plane1));
      wv[6] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(packed2, 4), low), high_bits<2>(plane1));
      wv[7] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(packed3, 4), low), high_bits<3>(plane1));
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
