// Attention of the native step, one query row at a time, reading the decoder's own cache in place: the same fp32
// operations in the same order as the package's row-attention kernel (native/csrc/row_attention.cpp), so the
// native step and transformers' modeling on the kernels attend alike, bit for bit.
//
// For query row (b, h, m) over its keys t ∈ [first_m, L_m) not masked out:
//   s_t = (q · k_t) · scale     8 lanes over d, then a fixed tree; four keys at once in independent chains
//   p_t = exp(s_t − max s)      one polynomial exp (vector body and tail compute the same operations)
//   o   = Σ_t (p_t / Σ p) v_t   t ascending
// Unlike the kernel, a step's attention runs serially (a decode step's few hundred KB of keys take microseconds;
// a fork-join region on a busy core costs a timeslice), and in parallel over rows only for long prefills.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace native_attention {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpLow = -87.0f;

inline float exp_scalar(float x) {  // x ≤ 0
  if (x < kExpLow) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += int32_t(n) << 23;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline float tree8(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

inline float dot_scalar(const float* q, const float* k, int64_t d) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < d; ++i) lanes[i % 8] = lanes[i % 8] + q[i] * k[i];
  return tree8(lanes);
}

#define NA_AVX2 __attribute__((target("avx2,fma")))

NA_AVX2 inline float tree8_avx(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

NA_AVX2 inline float dot_avx2(const float* q, const float* k, int64_t d) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i)));
  return tree8_avx(acc);
}

NA_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLow), _CMP_LT_OQ);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Lo)));
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
  const __m256i scaled = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
  return _mm256_andnot_ps(low, _mm256_castsi256_ps(scaled));
}

struct Row {
  const float* q;
  const float* k;  // [C, D] of this row's key/value head
  const float* v;
  float* out;      // [D]
  int64_t d;
  float scale;
};

inline void row_scalar(const Row& row, const std::vector<int64_t>& keys, std::vector<float>& p) {
  const int64_t count = int64_t(keys.size());
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < count; ++i) {
    p[i] = dot_scalar(row.q, row.k + keys[i] * row.d, row.d) * row.scale;
    top = std::max(top, p[i]);
  }
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < count; ++i) {
    p[i] = exp_scalar(p[i] - top);
    lanes[i % 8] = lanes[i % 8] + p[i];
  }
  const float total = tree8(lanes);
  for (int64_t j = 0; j < row.d; ++j) row.out[j] = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float weight = p[i] / total;
    const float* v = row.v + keys[i] * row.d;
    for (int64_t j = 0; j < row.d; ++j) row.out[j] = row.out[j] + weight * v[j];
  }
}

template <int CHUNKS>
NA_AVX2 void weighted_sum(const Row& row, const std::vector<int64_t>& keys, const std::vector<float>& p, float total) {
  const int64_t count = int64_t(keys.size());
  if (CHUNKS == 0) {
    for (int64_t j = 0; j < row.d; j += 8) _mm256_storeu_ps(row.out + j, _mm256_setzero_ps());
    for (int64_t t = 0; t < count; ++t) {
      const __m256 weight = _mm256_set1_ps(p[t] / total);
      const float* v = row.v + keys[t] * row.d;
      for (int64_t j = 0; j < row.d; j += 8)
        _mm256_storeu_ps(row.out + j, _mm256_add_ps(_mm256_loadu_ps(row.out + j), _mm256_mul_ps(weight, _mm256_loadu_ps(v + j))));
    }
    return;
  }
  __m256 acc[CHUNKS > 0 ? CHUNKS : 1];
  for (int c = 0; c < CHUNKS; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < count; ++t) {
    const __m256 weight = _mm256_set1_ps(p[t] / total);
    const float* v = row.v + keys[t] * row.d;
    for (int c = 0; c < CHUNKS; ++c) acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(weight, _mm256_loadu_ps(v + 8 * c)));
  }
  for (int c = 0; c < CHUNKS; ++c) _mm256_storeu_ps(row.out + 8 * c, acc[c]);
}

NA_AVX2 void row_avx2(const Row& row, const std::vector<int64_t>& keys, std::vector<float>& p) {
  const int64_t count = int64_t(keys.size());
  float top = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const float* k0 = row.k + keys[i] * row.d;
    const float* k1 = row.k + keys[i + 1] * row.d;
    const float* k2 = row.k + keys[i + 2] * row.d;
    const float* k3 = row.k + keys[i + 3] * row.d;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < row.d; j += 8) {
      const __m256 qj = _mm256_loadu_ps(row.q + j);
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(qj, _mm256_loadu_ps(k0 + j)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(qj, _mm256_loadu_ps(k1 + j)));
      a2 = _mm256_add_ps(a2, _mm256_mul_ps(qj, _mm256_loadu_ps(k2 + j)));
      a3 = _mm256_add_ps(a3, _mm256_mul_ps(qj, _mm256_loadu_ps(k3 + j)));
    }
    p[i] = tree8_avx(a0) * row.scale;
    p[i + 1] = tree8_avx(a1) * row.scale;
    p[i + 2] = tree8_avx(a2) * row.scale;
    p[i + 3] = tree8_avx(a3) * row.scale;
  }
  for (; i < count; ++i) p[i] = dot_avx2(row.q, row.k + keys[i] * row.d, row.d) * row.scale;
  for (i = 0; i < count; ++i) top = std::max(top, p[i]);
  __m256 sums = _mm256_setzero_ps();
  for (i = 0; i + 8 <= count; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(p.data() + i), _mm256_set1_ps(top)));
    _mm256_storeu_ps(p.data() + i, e);
    sums = _mm256_add_ps(sums, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sums);
  for (; i < count; ++i) {
    p[i] = exp_scalar(p[i] - top);
    lanes[i % 8] = lanes[i % 8] + p[i];
  }
  const float total = tree8(lanes);
  switch (row.d) {
    case 32: weighted_sum<4>(row, keys, p, total); break;
    case 64: weighted_sum<8>(row, keys, p, total); break;
    case 96: weighted_sum<12>(row, keys, p, total); break;
    case 128: weighted_sum<16>(row, keys, p, total); break;
    default: weighted_sum<0>(row, keys, p, total);
  }
}

// q [B, H, M, D]; k / v [B, Hkv, C, D] (the cache); out [B, M, H, D]. Row m of batch row b attends keys
// t ∈ [first[m], start + m + 1) with allowed[b·C + t] (null: all). vector: the AVX2 path (else the scalar one).
inline void attend(const float* q, const float* k, const float* v, float* out, int64_t B, int64_t H, int64_t Hkv,
                   int64_t M, int64_t D, int64_t C, int64_t start, int64_t window, const bool* allowed, float scale,
                   bool vector) {
  const int64_t group = H / Hkv;
  const int64_t rows = B * H * M;
  const int64_t keys_per_row = std::min<int64_t>(start + M, window > 0 ? window : start + M);
  const int64_t work = rows * keys_per_row * D;
  auto body = [&](int64_t begin, int64_t end) {
    std::vector<int64_t> keys;
    std::vector<float> p(std::max<int64_t>(start + M, 1));
    for (int64_t index = begin; index < end; ++index) {
      const int64_t b = index / (H * M), h = (index / M) % H, m = index % M, kv = h / group;
      const int64_t last = start + m + 1;
      const int64_t first = window > 0 ? std::max<int64_t>(0, last - window) : 0;
      const bool* ok = allowed ? allowed + b * C : nullptr;
      keys.resize(0);
      for (int64_t t = first; t < last; ++t)
        if (!ok || ok[t]) keys.push_back(t);
      float* o = out + ((b * M + m) * H + h) * D;
      if (keys.empty()) {
        std::fill(o, o + D, 0.0f);
        continue;
      }
      const Row row{q + ((b * H + h) * M + m) * D, k + (b * Hkv + kv) * C * D, v + (b * Hkv + kv) * C * D, o, D, scale};
      if (vector) {
        row_avx2(row, keys, p);
      } else {
        row_scalar(row, keys, p);
      }
    }
  };
  if (work < (int64_t(1) << 26)) {  // ~64 M multiply-adds (~10 ms): steps, verify passes and short prefills run here
    body(0, rows);
  } else {
    at::parallel_for(0, rows, 1, body);
  }
}

}  // namespace native_attention
