// Attention of the native step, one query row at a time, reading the decoder's own cache in place. The row's
// arithmetic is the package's row-attention kernel's own (native/csrc/row_math.h, which csrc/row_attention.cpp runs
// too), so the native step and transformers' modeling on the kernels attend alike, bit for bit.
//
// For query row (b, h, m) over its keys t ∈ [first_m, L_m) not masked out:
//   s_t = (q · k_t) · scale     8 lanes over d, then a fixed tree; four keys at once in independent chains
//   p_t = exp(s_t − max s)      one polynomial exp (vector body and tail compute the same operations)
//   o   = Σ_t (p_t / Σ p) v_t   t ascending
// Unlike the kernel, a step's attention runs serially (a decode step's few hundred KB of keys take microseconds;
// a fork-join region on a busy core costs a timeslice), and in parallel over rows only for long prefills.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../csrc/row_math.h"

namespace native_attention {

using ab_math::Row;
using ab_math::row_avx2;
using ab_math::row_scalar;

// q [B, H, M, D]; k / v [B, Hkv, C, D] (the cache); out [B, M, H, D]. Row m of batch row b attends keys
// t ∈ [first[m], start + m + 1) with allowed[b·C + t] (null: all). vector: the AVX2 path (else the scalar one).
inline void attend(const float* q, const float* k, const float* v, float* out, int64_t B, int64_t H, int64_t Hkv,
                   int64_t M, int64_t D, int64_t C, int64_t start, int64_t window, const bool* allowed, float scale,
                   bool vector) {
  TORCH_CHECK(H >= 1 && Hkv >= 1 && H % Hkv == 0 && D >= 1 && start >= 0 && M >= 0 && start + M <= C && window >= 0,
              "native attention: ", H, " heads over ", Hkv, " key/value heads of ", D, ", rows ", start, "..",
              start + M, " of a cache of ", C, ": heads a multiple of the key/value heads, the rows inside the cache");
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
