// The AVX2 and AVX-VNNI tiles (block_tile_avx2.inc, compiled once per instruction set) and the vectorized
// activation quantization. Internal linkage except the entry points (see block_layout.h on target flags).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "block_layout.h"

namespace ab_blocks {

namespace avx2_tiles {
namespace {
constexpr bool kVnni = false;
#define AB_WITH_VNNI 0
#define AB_TARGET __attribute__((target("avx2,fma,f16c")))
#include "block_tile_avx2.inc"
#undef AB_TARGET
#undef AB_WITH_VNNI
}  // namespace
}  // namespace avx2_tiles

namespace avxvnni_tiles {
namespace {
constexpr bool kVnni = true;
#define AB_WITH_VNNI 1
#define AB_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#include "block_tile_avx2.inc"
#undef AB_TARGET
#undef AB_WITH_VNNI
}  // namespace
}  // namespace avxvnni_tiles

TileFn pick_avx2(int kind, int rows) {
  using avx2_tiles::pair_tile;
  using avx2_tiles::tile;
  AB_KIND_TABLE(tile, pair_tile)
}

TileFn pick_avxvnni(int kind, int rows) {
  using avxvnni_tiles::pair_tile;
  using avxvnni_tiles::tile;
  AB_KIND_TABLE(tile, pair_tile)
}

// ---- activation quantization, 32 columns a block, 4 registers -------------------------------------------------
//   d = max|x| / 127, q = round-half-even(x · (1 / d)) clamped to ±127 (a NaN or infinity in the block: d = NaN,
//   q = 0; 1 / d overflowing: q = 0). The same operations as the scalar form, so the same bits.

namespace {

#define AB_Q_TARGET __attribute__((target("avx2,fma,f16c")))

AB_Q_TARGET inline int32_t sum8(__m256i v) {
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i s2 = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
}

AB_Q_TARGET void quantize_block(const float* x, int8_t* q, float* dx, float* zx, int32_t* bsum, int32_t* s32) {
  const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 v[4], amax = _mm256_setzero_ps();
  int finite = 0xFF;
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    const __m256 magnitude = _mm256_andnot_ps(sign, v[i]);
    finite &= _mm256_movemask_ps(_mm256_cmp_ps(magnitude, inf, _CMP_LT_OQ));  // false for NaN and ±inf
    amax = _mm256_max_ps(amax, magnitude);
  }
  if (finite != 0xFF) {
    std::memset(q, 0, kBlock);
    bsum[0] = bsum[1] = 0;
    s32[0] = 0;
    dx[0] = zx[0] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float d = _mm_cvtss_f32(m4) / 127.0f;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  if (!std::isfinite(id)) id = 0.0f;
  const __m256 scale = _mm256_set1_ps(id), high = _mm256_set1_ps(127.0f), lowest = _mm256_set1_ps(-127.0f);
  __m256i ints[4];
  for (int i = 0; i < 4; ++i) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(high, _mm256_max_ps(lowest, r));
    ints[i] = _mm256_cvttps_epi32(r);
  }
  const __m256i words = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3]));
  const __m256i bytes = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
  const int32_t first = sum8(_mm256_add_epi32(ints[0], ints[1])), second = sum8(_mm256_add_epi32(ints[2], ints[3]));
  bsum[0] = first;
  bsum[1] = second;
  s32[0] = first + second;
  dx[0] = d;
  zx[0] = d * float(first + second);
}

}  // namespace

void quantize_blocks_avx2(const float* x, int64_t k, int64_t begin, int64_t end, int8_t* q, float* dx, float* zx,
                          int32_t* bsum, int32_t* s32) {
  const int64_t blocks = k / kBlock;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t row = i / blocks, b = i % blocks;
    quantize_block(x + row * k + b * kBlock, q + row * k + b * kBlock, dx + i, zx + i, bsum + 2 * i, s32 + i);
  }
}

}  // namespace ab_blocks
