// Attention one query row at a time, in one fixed order of fp32 operations: batch-invariant by construction.
//
// For query row (b, h, m) over the keys it attends (t < L_m and mask[b, m, t]): softmax_t(q · k_t · scale) v_t in
// chunk_attention.h's arithmetic (fixed chunks of the row's keys, each with its own max, sum and weighted sum of
// V, combined in chunk order), which the native step's attention on its cache (cache_attention.cpp) runs too, so
// both attend alike bit for bit. Nothing depends on how many rows share the call, so a verify pass over M rows
// returns, row by row, what M one-token steps return. Query head h reads key/value head h / (H / H_kv)
// (grouped-query attention; the mask may differ by head here, so each head is read alone).
// The vector path (AVX2) and the scalar path compute the same operations in the same order.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "chunk_attention.h"
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

bool has_avx2() { return ab_cpu::has(ab_cpu::features(), ab_cpu::kAvx2 | ab_cpu::kFma | ab_cpu::kF16c); }

// q [B, H, M, D], k / v [B, Hkv, T, D], mask bool [B, 1 or H, M, T] or undefined, lengths int64 [M] (keys t < L_m).
// Returns [B, M, H, D].
at::Tensor row_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const c10::optional<at::Tensor>& mask, const at::Tensor& lengths, double scale, int64_t isa) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "row_attention: q, k, v must be 4-D");
  for (const at::Tensor* x : {&query, &key, &value})
    TORCH_CHECK(at::isFloatingType(x->scalar_type()), "row_attention: q, k, v must be floating point, got ",
                x->scalar_type());
  const int64_t b = query.size(0), h = query.size(1), m = query.size(2), d = query.size(3);
  const int64_t hkv = key.size(1), t = key.size(2);
  TORCH_CHECK(hkv >= 1 && h % hkv == 0, "row_attention: ", h, " query heads over ", hkv,
              " key/value heads: at least one, the query heads a multiple of them");
  TORCH_CHECK(key.size(0) == b && value.size(0) == b && value.size(1) == hkv && value.size(2) == t &&
                  key.size(3) == d && value.size(3) == d,
              "row_attention: q ", query.sizes(), ", k ", key.sizes(), ", v ", value.sizes(),
              " disagree: q [B, H, M, D], k and v [B, Hkv, T, D]");
  TORCH_CHECK(lengths.dim() <= 1 && lengths.numel() == m && !at::isComplexType(lengths.scalar_type()),
              "row_attention: lengths must hold one length per query row (", m, "), got ", lengths.sizes());
  const at::Tensor q = query.to(at::kFloat).contiguous();
  const at::Tensor k = key.to(at::kFloat).contiguous();
  const at::Tensor v = value.to(at::kFloat).contiguous();
  at::Tensor ok;
  const bool* okp = nullptr;
  int64_t mask_heads = 1;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->dim() == 4 && (mask->size(1) == 1 || mask->size(1) == h),
                "row_attention: the mask must be [B, 1 or H, M, T], got ", mask->sizes());
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
        const float* row_q = qp + ((bi * h + hi) * m + mi) * d;
        const int64_t offset = (bi * hkv + kv) * t * d;
        const ab_chunk::Cache cache{kp + offset, vp + offset, ab_chunk::Storage::kFloat};
        ab_chunk::row(&row_q, 1, cache, keys.data(), int64_t(keys.size()), d, scale_f, vector, &o);
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
