// Attention of one query row in fixed chunks of its keys: the arithmetic of the row-attention kernel
// (row_attention.cpp) and of the native step's attention on its cache (cache_attention.cpp), in one place.
//
// A row's keys are the list t_0 < t_1 < … < t_{n−1} it attends (causal, window and padding applied); chunk c holds
// the list's entries [cS, min(n, (c + 1)S)), S = kChunk, counted in the list (not in cache slots: a row's bits do
// not depend on the padding in front of it). For each chunk, alone:
//   s_i = (q · k_i) · scale            8 lanes over d (lane j sums d ≡ j mod 8, d ascending), then tree8
//   m_c = max_i s_i                    8 lanes over i, then in lane order (x > m ? x : m: exact, NaN-stable)
//   p_i = exp(s_i − m_c)               row_math.h's polynomial exp
//   l_c = Σ_i p_i                      8 lanes over i (lane i mod 8), then tree8
//   u_c = Σ_i p_i v_i                  i ascending, for every element of v
// and then, chunks ascending:
//   M = max_c m_c ; a_c = exp(m_c − M) ; L = Σ_c a_c l_c ; o = (Σ_c a_c u_c) / L
// The chunking and both reductions are fixed: the thread that computes a chunk, how many threads share a call and
// which rows share it change no bit. The query heads of one key/value head share each chunk's read of K and V
// (grouped-query attention); each head's operations are its own, so grouping changes no bit either.
// K and V are fp32, fp16 or bf16 rows read in place (a half value is converted as it is loaded: exactly), so a
// half cache attends as the fp32 attention of its values.
// The AVX2 bodies compute the scalar ones' operations in the same order (a vector of 8 is the 8 lanes); they keep
// the work in registers: four keys' dot products for up to three heads at once (each K load serves all of them),
// and up to three heads' u over 32 elements of v at once (each V load serves all of them).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "row_math.h"

namespace ab_chunk {

using ab_math::exp_avx2;
using ab_math::exp_scalar;
using ab_math::tree8;
using ab_math::tree8_avx;

#define AB_CHUNK_AVX2 __attribute__((target("avx2,fma,f16c")))

constexpr int64_t kChunk = 256;  // keys per chunk: S above
constexpr int64_t kBlock = 32;   // keys per block of u's sums (the block's V stays in L1 across v's slices)
constexpr int kHeadsAtOnce = 3;  // heads whose sums share registers (AVX2's 16: 12 sums, 4 loads)

enum class Storage { kFloat, kHalf, kBFloat16 };

inline int64_t chunks_of(int64_t keys) { return (keys + kChunk - 1) / kChunk; }

// Where a key/value head's rows are: [T, d] of `storage`.
struct Cache {
  const void* k;
  const void* v;
  Storage storage;
};

// ---- loading a row's values as fp32 (exact) -------------------------------------------------------------------

template <Storage S>
inline float load1(const void* row, int64_t j) {
  if constexpr (S == Storage::kFloat) {
    return static_cast<const float*>(row)[j];
  } else if constexpr (S == Storage::kHalf) {
    return float(c10::Half(static_cast<const uint16_t*>(row)[j], c10::Half::from_bits()));
  } else {
    return float(c10::BFloat16(static_cast<const uint16_t*>(row)[j], c10::BFloat16::from_bits()));
  }
}

template <Storage S>
AB_CHUNK_AVX2 inline __m256 load8(const void* row, int64_t j) {
  if constexpr (S == Storage::kFloat) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + j);
  } else {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + j));
    if constexpr (S == Storage::kHalf) return _mm256_cvtph_ps(bits);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
}

// ---- one chunk for a group of heads ----------------------------------------------------------------------------

// The chunk's keys: rows[i] points at key i's row of K (and of V at the same index).
struct Rows {
  const void* const* k;
  const void* const* v;
  int64_t n, d;
};

// A chunk's outcome for head g of the group: m_c at max[g · stride], l_c at sum[g · stride], u_c [d] at
// u + g · u_stride.
struct Partial {
  float* max;
  float* sum;
  int64_t stride;
  float* u;
  int64_t u_stride;
};

// s_{h, i} = (q_h · k_i) · scale into p[h · kChunk + i], for NH heads: four keys at once, each K load for all heads.
template <Storage S, int NH>
AB_CHUNK_AVX2 void scores_avx2(const float* const* q, const Rows& rows, float scale, float* p) {
  const int64_t n = rows.n, d = rows.d;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256 acc[NH][4];
    for (int h = 0; h < NH; ++h)
      for (int r = 0; r < 4; ++r) acc[h][r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 8) {
      __m256 k[4];
      for (int r = 0; r < 4; ++r) k[r] = load8<S>(rows.k[i + r], j);
      for (int h = 0; h < NH; ++h) {
        const __m256 qj = _mm256_loadu_ps(q[h] + j);
        for (int r = 0; r < 4; ++r) acc[h][r] = _mm256_add_ps(acc[h][r], _mm256_mul_ps(qj, k[r]));
      }
    }
    for (int h = 0; h < NH; ++h)
      for (int r = 0; r < 4; ++r) p[h * kChunk + i + r] = tree8_avx(acc[h][r]) * scale;
  }
  for (; i < n; ++i) {
    __m256 acc[NH];
    for (int h = 0; h < NH; ++h) acc[h] = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 8) {
      const __m256 k = load8<S>(rows.k[i], j);
      for (int h = 0; h < NH; ++h) acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(_mm256_loadu_ps(q[h] + j), k));
    }
    for (int h = 0; h < NH; ++h) p[h * kChunk + i] = tree8_avx(acc[h]) * scale;
  }
}

template <Storage S>
inline void scores_scalar(const float* const* q, int64_t heads, const Rows& rows, float scale, float* p) {
  for (int64_t i = 0; i < rows.n; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t j = 0; j < rows.d; ++j) lanes[j % 8] = lanes[j % 8] + q[h][j] * load1<S>(rows.k[i], j);
      p[h * kChunk + i] = tree8(lanes) * scale;
    }
}

// p_i = exp(s_i − top) in place over the whole eights of n scores, their sums into lanes; returns where the tail
// begins.
AB_CHUNK_AVX2 inline int64_t exp_eights_avx2(float* s, int64_t n, float top, float* lanes) {
  __m256 sums = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), _mm256_set1_ps(top)));
    _mm256_storeu_ps(s + i, e);
    sums = _mm256_add_ps(sums, e);
  }
  _mm256_storeu_ps(lanes, sums);
  return i;
}

// larger(x, top) = x > top ? x : top: _mm256_max_ps(x, top)'s rule lane by lane (a NaN x leaves top).
inline float larger(float x, float top) { return x > top ? x : top; }

// lanes[i mod 8] = larger(s_i, lanes[i mod 8]) over the whole eights of n scores; returns where the tail begins.
AB_CHUNK_AVX2 inline int64_t max_eights_avx2(const float* s, int64_t n, float* lanes) {
  __m256 top = _mm256_loadu_ps(lanes);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) top = _mm256_max_ps(_mm256_loadu_ps(s + i), top);
  _mm256_storeu_ps(lanes, top);
  return i;
}

// p_i = exp(s_i − m) in place over n scores, m = max s_i (8 lanes over i, then lanes 1..7 into lane 0 in order)
// into *max_out; returns l = Σ p_i (lanes i mod 8, tree8).
inline float softmax_terms(float* s, int64_t n, bool vector, float* max_out) {
  const float low = -std::numeric_limits<float>::infinity();
  float tops[8] = {low, low, low, low, low, low, low, low};
  for (int64_t i = vector ? max_eights_avx2(s, n, tops) : 0; i < n; ++i) tops[i % 8] = larger(s[i], tops[i % 8]);
  float top = tops[0];
  for (int lane = 1; lane < 8; ++lane) top = larger(tops[lane], top);
  *max_out = top;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t tail = vector ? exp_eights_avx2(s, n, top, lanes) : 0;
  for (int64_t i = tail; i < n; ++i) {  // the scalar path, and the vector path's tail: lane i % 8
    s[i] = exp_scalar(s[i] - top);
    lanes[i % 8] = lanes[i % 8] + s[i];
  }
  return tree8(lanes);
}

// u_h[j] += Σ_i p_h[i] v_i[j] over keys [i0, i1), i ascending, for NH heads and W · 8 elements from j0 (the sums
// kept in u between blocks: stored and reloaded exactly).
template <Storage S, int NH, int W>
AB_CHUNK_AVX2 void weighted_block_avx2(const float* const* p, const Rows& rows, int64_t i0, int64_t i1, int64_t j0,
                                       float* const* u) {
  __m256 acc[NH][W];
  for (int h = 0; h < NH; ++h)
    for (int w = 0; w < W; ++w) acc[h][w] = _mm256_loadu_ps(u[h] + j0 + 8 * w);
  for (int64_t i = i0; i < i1; ++i) {
    __m256 weight[NH];
    for (int h = 0; h < NH; ++h) weight[h] = _mm256_set1_ps(p[h][i]);
    for (int w = 0; w < W; ++w) {
      const __m256 vw = load8<S>(rows.v[i], j0 + 8 * w);
      for (int h = 0; h < NH; ++h) acc[h][w] = _mm256_add_ps(acc[h][w], _mm256_mul_ps(weight[h], vw));
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(u[h] + j0 + 8 * w, acc[h][w]);
}

template <Storage S, int NH>
AB_CHUNK_AVX2 void weighted_avx2(const float* const* p, const Rows& rows, float* const* u) {
  for (int64_t i0 = 0; i0 < rows.n; i0 += kBlock) {
    const int64_t i1 = std::min(rows.n, i0 + kBlock);
    int64_t j = 0;
    for (; j + 32 <= rows.d; j += 32) weighted_block_avx2<S, NH, 4>(p, rows, i0, i1, j, u);
    for (; j < rows.d; j += 8) weighted_block_avx2<S, NH, 1>(p, rows, i0, i1, j, u);
  }
}

template <Storage S>
inline void weighted_scalar(const float* p, const Rows& rows, float* u) {
  for (int64_t i = 0; i < rows.n; ++i)
    for (int64_t j = 0; j < rows.d; ++j) u[j] = u[j] + p[i] * load1<S>(rows.v[i], j);
}

// Heads [g0, g0 + NH) of the group on AVX2: their scores, then (after the softmax terms) their u.
template <Storage S, int NH>
AB_CHUNK_AVX2 void heads_avx2(const float* const* q, const Rows& rows, float scale, float* p, const Partial& out,
                              int64_t g0, bool weights) {
  if (!weights) {
    scores_avx2<S, NH>(q + g0, rows, scale, p + g0 * kChunk);
    return;
  }
  const float* pg[NH];
  float* ug[NH];
  for (int h = 0; h < NH; ++h) pg[h] = p + (g0 + h) * kChunk, ug[h] = out.u + (g0 + h) * out.u_stride;
  weighted_avx2<S, NH>(pg, rows, ug);
}

template <Storage S>
void heads_in_threes(const float* const* q, int64_t heads, const Rows& rows, float scale, float* p,
                     const Partial& out, bool weights) {
  for (int64_t g0 = 0; g0 < heads; g0 += kHeadsAtOnce) {
    switch (std::min<int64_t>(kHeadsAtOnce, heads - g0)) {
      case 1: heads_avx2<S, 1>(q, rows, scale, p, out, g0, weights); break;
      case 2: heads_avx2<S, 2>(q, rows, scale, p, out, g0, weights); break;
      default: heads_avx2<S, 3>(q, rows, scale, p, out, g0, weights);
    }
  }
}

// One chunk (rows.n keys) for `heads` query rows q[g] (the heads of one key/value head); p: [heads, kChunk].
template <Storage S>
void chunk(const float* const* q, int64_t heads, const Rows& rows, float scale, bool vector, float* p,
           const Partial& out) {
  if (vector) {
    heads_in_threes<S>(q, heads, rows, scale, p, out, false);
  } else {
    scores_scalar<S>(q, heads, rows, scale, p);
  }
  for (int64_t g = 0; g < heads; ++g) {
    out.sum[g * out.stride] = softmax_terms(p + g * kChunk, rows.n, vector, out.max + g * out.stride);
    std::fill(out.u + g * out.u_stride, out.u + g * out.u_stride + rows.d, 0.0f);
  }
  if (vector) {
    heads_in_threes<S>(q, heads, rows, scale, p, out, true);
  } else {
    for (int64_t g = 0; g < heads; ++g) weighted_scalar<S>(p + g * kChunk, rows, out.u + g * out.u_stride);
  }
}

// o = (Σ_c a_c u_c) / Σ_c a_c l_c, a_c = exp(m_c − max m), chunks ascending: one head's partials, chunk c's u at
// u + c · stride. The same scalar operations on every path.
inline void combine(const float* max, const float* sum, const float* u, int64_t stride, int64_t chunks, int64_t d,
                    float* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < chunks; ++c) top = std::max(top, max[c]);
  float total = 0.0f;
  std::fill(out, out + d, 0.0f);
  for (int64_t c = 0; c < chunks; ++c) {
    const float a = exp_scalar(max[c] - top);
    total = total + a * sum[c];
    for (int64_t j = 0; j < d; ++j) out[j] = out[j] + a * u[c * stride + j];
  }
  for (int64_t j = 0; j < d; ++j) out[j] = out[j] / total;
}

// ---- a row's chunks ----------------------------------------------------------------------------------------------

// Per thread: a chunk's row pointers and its scores / weights per head.
struct Scratch {
  std::vector<const void*> k, v;
  std::vector<float> p;
};

inline Scratch& scratch(int64_t heads) {
  static thread_local Scratch buffers;
  if (buffers.k.empty()) buffers.k.resize(kChunk), buffers.v.resize(kChunk);
  if (int64_t(buffers.p.size()) < heads * kChunk) buffers.p.resize(heads * kChunk);
  return buffers;
}

// Chunk c of keys[0..n) for the heads q[0..heads): K and V read once for all of them.
inline void chunk_of_row(const float* const* q, int64_t heads, const Cache& cache, const int64_t* keys, int64_t n,
                         int64_t c, int64_t d, float scale, bool vector, const Partial& out) {
  Scratch& buffers = scratch(heads);
  const int64_t first = c * kChunk, count = std::min(n - first, kChunk);
  const int64_t bytes = d * (cache.storage == Storage::kFloat ? 4 : 2);
  for (int64_t i = 0; i < count; ++i) {
    buffers.k[i] = static_cast<const char*>(cache.k) + keys[first + i] * bytes;
    buffers.v[i] = static_cast<const char*>(cache.v) + keys[first + i] * bytes;
  }
  const Rows rows{buffers.k.data(), buffers.v.data(), count, d};
  switch (cache.storage) {
    case Storage::kFloat: chunk<Storage::kFloat>(q, heads, rows, scale, vector, buffers.p.data(), out); break;
    case Storage::kHalf: chunk<Storage::kHalf>(q, heads, rows, scale, vector, buffers.p.data(), out); break;
    case Storage::kBFloat16: chunk<Storage::kBFloat16>(q, heads, rows, scale, vector, buffers.p.data(), out); break;
  }
}

// out[g] = the attention of q[g] over keys[0..n) (n ≥ 1), every chunk in turn on this thread.
inline void row(const float* const* q, int64_t heads, const Cache& cache, const int64_t* keys, int64_t n, int64_t d,
                float scale, bool vector, float* const* out) {
  static thread_local std::vector<float> partials;
  const int64_t chunks = chunks_of(n);
  if (int64_t(partials.size()) < heads * chunks * (d + 2)) partials.resize(heads * chunks * (d + 2));
  float* max = partials.data();  // [heads][chunks]
  float* sum = max + heads * chunks;
  float* u = sum + heads * chunks;  // [heads][chunks][d]
  for (int64_t c = 0; c < chunks; ++c)
    chunk_of_row(q, heads, cache, keys, n, c, d, scale, vector,
                 Partial{max + c, sum + c, chunks, u + c * d, chunks * d});
  for (int64_t g = 0; g < heads; ++g)
    combine(max + g * chunks, sum + g * chunks, u + g * chunks * d, d, chunks, d, out[g]);
}

}  // namespace ab_chunk
