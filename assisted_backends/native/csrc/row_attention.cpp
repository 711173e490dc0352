// Attention one query row at a time, in one fixed order of fp32 operations: batch-invariant by construction.
//
// For query row (b, h, m) over the keys it attends (t < L_m and mask[b, m, t]):
//   s_t = (q · k_t) · scale          q · k_t: 8 lanes over d (lane i sums d ≡ i mod 8, d ascending), then a fixed tree
//   p_t = exp(s_t − max_t s_t)       one polynomial exp (no library call, no FMA)
//   o   = Σ_t (p_t / Σ_t p_t) · v_t  t ascending; Σ_t p_t: 8 lanes over t, then the same fixed tree
// Nothing depends on how many rows share the call, so a verify pass over M rows returns, row by row, what M
// one-token steps return. Query head h reads key/value head h / (H / H_kv) (grouped-query attention).
// The vector path (AVX2) and the scalar path compute the same operations in the same order.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "cpu_features.h"
#include "tile_pool.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpLow = -87.0f;  // exp below this is taken as 0

// exp(x) for x ≤ 0: x = n ln2 + r, |r| ≤ ln2 / 2, exp(r) by a degree-6 polynomial (Horner), times 2^n.
inline float exp_scalar(float x) {
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

inline float tree8(const float* a) {  // ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

float dot_scalar(const float* q, const float* k, int64_t d) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < d; ++i) lanes[i % 8] = lanes[i % 8] + q[i] * k[i];
  return tree8(lanes);
}

#define AB_AVX2 __attribute__((target("avx2,fma")))

AB_AVX2 inline float tree8_avx(__m256 v) {  // the same tree as tree8: (a_i + a_{i+4}), then pairs (0, 2) and (1, 3)
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

AB_AVX2 float dot_avx2(const float* q, const float* k, int64_t d) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i)));
  return tree8_avx(acc);
}

AB_AVX2 __m256 exp_avx2(__m256 x) {
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

// One query row: scores over `count` keys (their indices in `keys`), softmax, weighted sum of values.
struct Row {
  const float* q;
  const float* k;  // [T, D] of this row's key/value head
  const float* v;
  float* out;      // [D]
  int64_t d;
  float scale;
};

void row_scalar(const Row& row, const std::vector<int64_t>& keys, std::vector<float>& p) {
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

// o = Σ_t (p_t / total) · v_t, t ascending for every element (CHUNKS = D / 8 accumulators; 0: any D, in memory).
template <int CHUNKS>
AB_AVX2 void weighted_sum(const Row& row, const std::vector<int64_t>& keys, const std::vector<float>& p, float total) {
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

AB_AVX2 void row_avx2(const Row& row, const std::vector<int64_t>& keys, std::vector<float>& p) {
  const int64_t count = int64_t(keys.size());
  float top = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {  // four keys at once: four independent chains, each in the order of dot_avx2
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
  for (; i < count; ++i) {  // the tail: lane i % 8, as the scalar path
    p[i] = exp_scalar(p[i] - top);
    lanes[i % 8] = lanes[i % 8] + p[i];
  }
  const float total = tree8(lanes);
  switch (row.d) {  // accumulators in registers for the common head sizes
    case 32: weighted_sum<4>(row, keys, p, total); break;
    case 64: weighted_sum<8>(row, keys, p, total); break;
    case 96: weighted_sum<12>(row, keys, p, total); break;
    case 128: weighted_sum<16>(row, keys, p, total); break;
    default: weighted_sum<0>(row, keys, p, total);
  }
}

bool has_avx2() { return ab_cpu::has(ab_cpu::features(), ab_cpu::kAvx2 | ab_cpu::kFma); }

// q [B, H, M, D], k / v [B, Hkv, T, D], mask bool [B, 1 or H, M, T] or undefined, lengths int64 [M] (keys t < L_m).
// Returns [B, M, H, D].
at::Tensor row_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const c10::optional<at::Tensor>& mask, const at::Tensor& lengths, double scale, int64_t isa) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "row_attention: q, k, v must be 4-D");
  const at::Tensor q = query.to(at::kFloat).contiguous();
  const at::Tensor k = key.to(at::kFloat).contiguous();
  const at::Tensor v = value.to(at::kFloat).contiguous();
  const int64_t b = q.size(0), h = q.size(1), m = q.size(2), d = q.size(3), hkv = k.size(1), t = k.size(2);
  TORCH_CHECK(h % hkv == 0 && v.size(2) == t && k.size(3) == d && v.size(3) == d, "row_attention: shapes disagree");
  TORCH_CHECK(lengths.numel() == m, "row_attention: one length per query row");
  at::Tensor ok;
  const bool* okp = nullptr;
  int64_t mask_heads = 1;
  if (mask.has_value() && mask->defined()) {
    ok = mask->to(at::kBool).expand({b, mask->size(1), m, t}).contiguous();
    mask_heads = ok.size(1);
    okp = ok.data_ptr<bool>();
  }
  const at::Tensor len = lengths.to(at::kLong).contiguous();
  const int64_t* lp = len.data_ptr<int64_t>();
  at::Tensor out = at::empty({b, m, h, d}, at::kFloat);
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = h / hkv;
  const bool vector = (isa != 0) && has_avx2() && d % 8 == 0;
  const float scale_f = float(scale);
  // (batch, head) pairs handed out one at a time on the kernels' pool (tile_pool.h: no fork-join region beside
  // it); each pair's rows are computed by the thread that took it, so the thread count changes no bit.
  const int64_t pairs = b * h;
  std::atomic<int64_t> next{0};
  auto job = [&]() {
    std::vector<int64_t> keys;
    std::vector<float> p(std::max<int64_t>(t, 1));
    for (int64_t bh; (bh = next.fetch_add(1, std::memory_order_relaxed)) < pairs;) {
      const int64_t bi = bh / h, hi = bh % h, kv = hi / group;
      for (int64_t mi = 0; mi < m; ++mi) {
        const int64_t limit = std::min<int64_t>(lp[mi], t);
        const bool* row_ok = okp ? okp + ((bi * mask_heads + (mask_heads == 1 ? 0 : hi)) * m + mi) * t : nullptr;
        keys.resize(0);
        keys.reserve(limit);
        for (int64_t ti = 0; ti < limit; ++ti)
          if (!row_ok || row_ok[ti]) keys.push_back(ti);
        float* o = op + ((bi * m + mi) * h + hi) * d;
        if (keys.empty()) {
          std::fill(o, o + d, 0.0f);
          continue;
        }
        const Row row{qp + ((bi * h + hi) * m + mi) * d, kp + (bi * hkv + kv) * t * d, vp + (bi * hkv + kv) * t * d, o, d, scale_f};
        if (vector) {
          row_avx2(row, keys, p);
        } else {
          row_scalar(row, keys, p);
        }
      }
    }
  };
  // A second thread only for ~256 K multiply-adds or more (a decode step's few heads over a short context are not
  // worth its wake-up).
  const int64_t work = pairs * m * t * d * 2;
  int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  threads = std::max<int64_t>(1, std::min<int64_t>({threads, pairs, std::max<int64_t>(1, work >> 18)}));
  ab_pool::Pool::get().run(threads - 1, job);
  return query.scalar_type() == at::kFloat ? out : out.to(query.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(assisted_backends, m) {
  m.def("row_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor lengths, float scale, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(assisted_backends, CPU, m) {
  m.impl("row_attention", &row_attention);
}
