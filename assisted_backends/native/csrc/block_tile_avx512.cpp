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

template <class K, int ROWS>
AB_AVX512 void tile(const Weights& w, const Activations& a, int64_t t, int64_t m0, float* y) {
  constexpr int kChunks = K::BITS == 8 ? K::G / 4 : 8;  // dot products of 4 columns per group
  constexpr int64_t kGroupBytes = K::GROUP_BYTES;
  const int64_t groups = w.groups, supers = K::SB1 ? w.groups : w.supers, sb = K::SB1 ? 1 : w.sb;
  const int64_t blocks = a.k / kBlock, pf = w.prefetch;
  const uint8_t* codes = w.codes + t * groups * kGroupBytes;
  const uint16_t* dp = w.d + t * supers * kTile;
  const uint16_t* mp = K::MIN ? w.dmin + t * supers * kTile : nullptr;
  const int8_t* scp = K::SC ? w.sc + t * groups * kTile : nullptr;
  const int8_t* mnp = K::MN ? w.mn + t * groups * kTile : nullptr;
  const int32_t correction = K::BITS == 8 ? 128 : w.offset;
  const int8_t* xq[ROWS];
  const float* dx[ROWS];
  const float* zx[ROWS];
  const int32_t* sums[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    xq[r] = a.q + (m0 + r) * a.k;
    dx[r] = a.dx + (m0 + r) * blocks;
    zx[r] = a.zx + (m0 + r) * blocks;
    sums[r] = K::G16 ? a.bsum + (m0 + r) * (a.k / 16) : a.s32 + (m0 + r) * blocks;
  }
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
        const int8_t* x = xq[r] + g * K::G;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int c = 0; c < kChunks; c += 2) {
          s0 = _mm512_dpbusd_epi32(s0, wv[c], broadcast4(x + 4 * c));
          s1 = _mm512_dpbusd_epi32(s1, wv[c + 1], broadcast4(x + 4 * c + 4));
        }
        __m512i isum = _mm512_add_epi32(s0, s1);
        if (K::BITS == 8 || K::OFF) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(correction * sums[r][g]));
        const __m512 term = _mm512_mul_ps(_mm512_mul_ps(scale, _mm512_set1_ps(dx[r][b])), _mm512_cvtepi32_ps(isum));
        acc[r] = _mm512_add_ps(acc[r], term);
        if (K::MIN) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(zero, _mm512_set1_ps(zx[r][b])));
      }
    }
  }
  const int64_t valid = w.n - t * kTile;
  const __mmask16 mask = valid >= kTile ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  for (int r = 0; r < ROWS; ++r) _mm512_mask_storeu_ps(y + (m0 + r) * w.n + t * kTile, mask, acc[r]);
}

}  // namespace

TileFn pick_avx512(int kind, int rows) { AB_KIND_TABLE(tile) }

}  // namespace ab_blocks
