// The AVX-512 pieces the AVX-512 VNNI tile (block_tile_avx512.cpp) and the AMX tile (block_tile_amx.cpp) share: fp16
// and int8 scale loads, a group's fp32 step (one code for both, so both give the same bits), the masked store of a
// tile's rows, and the unpacking of stored codes into 8 vectors of unsigned bytes q (4- and 5-bit groups, Q6_K's
// pair units). Internal linkage, compiled under each includer's
// AVX-512 target attribute only (see block_layout.h on target flags).
#pragma once

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

// Group g's scale S = d · sc and zero Z = dmin · mn, each factor where the kind has it.
template <class K>
AB_AVX512 inline void group_scales(const TileStreams<K>& st, int64_t g, __m512 d, __m512 dmin, __m512& scale,
                                   __m512& zero) {
  scale = K::SC ? _mm512_mul_ps(d, bytes16(st.sc + g * kTile)) : d;
  zero = K::MN ? _mm512_mul_ps(dmin, bytes16(st.mn + g * kTile)) : dmin;
}

// acc + (S · d_x) · (I − correction · Σ q_x) (+ Z · z_x) for row r and group g, from the group's integer sums I:
// the fp32 operations, in this order, of every path (the scalar path's too).
template <class K, int ROWS>
AB_AVX512 inline __m512 add_group(const TileStreams<K>& st, const RowsAt<ROWS>& in, int r, int64_t g, __m512i isum,
                                  __m512 scale, __m512 zero, __m512 acc) {
  const int64_t b = K::G16 ? g >> 1 : g;
  if (K::BITS == 8 || K::OFF) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(st.correction * in.sums[r][g]));
  const __m512 term = _mm512_mul_ps(_mm512_mul_ps(scale, _mm512_set1_ps(in.dx[r][b])), _mm512_cvtepi32_ps(isum));
  acc = _mm512_add_ps(acc, term);
  if (K::MIN) acc = _mm512_add_ps(acc, _mm512_mul_ps(zero, _mm512_set1_ps(in.zx[r][b])));
  return acc;
}

// Rows m0.. of the output tile t (its last tile masked to the N rows that exist).
template <int ROWS>
AB_AVX512 inline void store(const Weights& w, int64_t t, int64_t m0, const __m512* acc, float* y) {
  const int64_t valid = w.n - t * kTile;
  const __mmask16 mask = valid >= kTile ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  for (int r = 0; r < ROWS; ++r) _mm512_mask_storeu_ps(y + (m0 + r) * w.n + t * kTile, mask, acc[r]);
}

// A 32-column group of 4 or 5 bits as 8 chunks of q (chunk c < 4: the low nibbles of bytes 64c.., c ≥ 4 the high
// ones; 5 bits: plus 16 where bit i of the plane's mask c is set).
template <int BITS>
AB_AVX512 inline void unpack_group(const uint8_t* group, __m512i* wv) {
  const __m512i low = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
  for (int c = 0; c < 4; ++c) {
    const __m512i packed = _mm512_loadu_si512(group + 64 * c);
    wv[c] = _mm512_and_si512(packed, low);
    wv[c + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
  }
  if (BITS == 5) {
    for (int c = 0; c < 8; ++c) {
      uint64_t bits;
      std::memcpy(&bits, group + 256 + 8 * c, 8);
      wv[c] = _mm512_mask_add_epi8(wv[c], _cvtu64_mask64(bits), wv[c], fifth);
    }
  }
}

template <int C>
AB_AVX512 inline __m512i high_bits(__m512i plane) {  // chunk C's two bits moved to bits 4-5 of each byte
  const __m512i moved = C < 2 ? _mm512_slli_epi16(plane, 4 - 2 * C) : _mm512_srli_epi16(plane, 2 * C - 4);
  return _mm512_and_si512(moved, _mm512_set1_epi8(0x30));
}

// A Q6_K unit (groups 2p and 2p + 1, 384 bytes) as 8 chunks of q: 0-3 group 2p, 4-7 group 2p + 1.
AB_AVX512 inline void unpack_pair(const uint8_t* unit, __m512i* wv) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i plane0 = _mm512_loadu_si512(unit + 256), plane1 = _mm512_loadu_si512(unit + 320);
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
}

}  // namespace
}  // namespace ab_blocks
