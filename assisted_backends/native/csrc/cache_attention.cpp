// The native step's attention on its own cache, in place: `cache_attention`, on the kernels' thread pool.
//
// Row m of batch row b attends keys t ∈ [first, start + m + 1) with allowed[b, t] (first = start + m + 1 − window
// for a sliding layer, else 0), in chunk_attention.h's arithmetic: fixed chunks of its key list, combined in chunk
// order. The heads of one key/value head share each chunk's read of K and V. The cache is fp32, fp16 or bf16
// [B, Hkv, C, D] (a half cache is converted chunk by chunk, exactly).
// Work: a step or a verify pass (few rows) is split by (b, key/value head, chunk), so a long context spreads over
// the threads even with few heads; each chunk's partials are kept and combined afterwards in chunk order. Many
// rows (a prefill) go by (b, key/value head, row), each computing its chunks in turn. Both give every row the
// same bits, at any thread count, alone or in a batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "chunk_attention.h"
#include "cpu_features.h"
#include "tile_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace {

using ab_chunk::Cache;
using ab_chunk::Partial;
using ab_chunk::Storage;

constexpr int64_t kSplitRows = 16;  // B · M up to this: split by chunks (steps, verify passes)

Storage storage_of(const at::Tensor& t) {
  const at::ScalarType type = t.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16,
              "cache_attention: the cache must be float32, float16 or bfloat16, got ", type);
  return type == at::kFloat ? Storage::kFloat : type == at::kHalf ? Storage::kHalf : Storage::kBFloat16;
}

// q [B, H, M, D] fp32; k / v [B, Hkv, C, D] (the cache); allowed [B, C] bool or none. Returns [B, M, H, D] fp32.
// (The native step's tensors are contiguous already: the cache is read in place, never copied.)
at::Tensor cache_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           const c10::optional<at::Tensor>& allowed, int64_t start, int64_t window, double scale,
                           int64_t isa) {
  TORCH_CHECK(query.dim() == 4 && query.scalar_type() == at::kFloat,
              "cache_attention: q must be fp32 [B, H, M, D], got ", query.sizes(), " ", query.scalar_type());
  const int64_t B = query.size(0), H = query.size(1), M = query.size(2), D = query.size(3);
  TORCH_CHECK(key.dim() == 4 && key.sizes() == value.sizes() && key.scalar_type() == value.scalar_type() &&
                  key.size(0) == B && key.size(3) == D,
              "cache_attention: k and v must be one [", B, ", Hkv, C, ", D, "] cache each, of one type, got ",
              key.sizes(), " and ", value.sizes());
  const at::Tensor q = query.contiguous(), k = key.contiguous(), v = value.contiguous();
  const Storage storage = storage_of(k);
  const int64_t Hkv = k.size(1), C = k.size(2);
  TORCH_CHECK(Hkv >= 1 && H % Hkv == 0 && D >= 1, "cache_attention: ", H, " heads over ", Hkv,
              " key/value heads: the heads a multiple of them");
  TORCH_CHECK(start >= 0 && start + M <= C && window >= 0, "cache_attention: rows ", start, "..", start + M,
              " of a cache of ", C, " positions (window ", window, "): the rows inside the cache");
  const bool* ok = nullptr;
  at::Tensor mask;
  if (allowed.has_value() && allowed->defined()) {
    TORCH_CHECK(allowed->numel() == B * C, "cache_attention: allowed must be [B, C] = [", B, ", ", C, "], got ",
                allowed->sizes());
    mask = allowed->to(at::kBool).contiguous();
    ok = mask.data_ptr<bool>();
  }
  const bool vector =
      isa != 0 && D % 8 == 0 && ab_cpu::has(ab_cpu::features(), ab_cpu::kAvx2 | ab_cpu::kFma | ab_cpu::kF16c);
  const int64_t G = H / Hkv, element = k.element_size();
  const float scale_f = float(scale);
  at::Tensor out = at::empty({B, M, H, D}, at::kFloat);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());

  // row (b, m)'s keys, ascending
  auto keys_of = [&](int64_t b, int64_t m, std::vector<int64_t>& keys) {
    const int64_t last = start + m + 1, first = window > 0 ? std::max<int64_t>(0, last - window) : 0;
    keys.clear();
    for (int64_t t = first; t < last; ++t)
      if (!ok || ok[b * C + t]) keys.push_back(t);
  };
  auto cache_of = [&](int64_t b, int64_t kv) {
    const int64_t offset = (b * Hkv + kv) * C * D * element;
    return Cache{kp + offset, vp + offset, storage};
  };
  auto heads_of = [&](int64_t b, int64_t kv, int64_t m, std::vector<const float*>& qs, std::vector<float*>& outs) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = kv * G + g;
      qs[g] = qp + ((b * H + h) * M + m) * D;
      outs[g] = op + ((b * M + m) * H + h) * D;
    }
  };
  auto zeros = [&](int64_t b, int64_t m, int64_t kv) {
    std::fill(op + ((b * M + m) * H + kv * G) * D, op + ((b * M + m) * H + (kv + 1) * G) * D, 0.0f);
  };

  int64_t work = 0;  // multiply-adds, for the thread count
  const bool split = B * M <= kSplitRows;
  std::vector<std::vector<int64_t>> lists;  // split: every row's keys, made once
  std::vector<int64_t> items;               // split: (b, kv, c) as one index
  int64_t most_chunks = 0;
  if (split) {
    lists.resize(B * M);
    for (int64_t r = 0; r < B * M; ++r) {
      keys_of(r / M, r % M, lists[r]);
      most_chunks = std::max(most_chunks, ab_chunk::chunks_of(int64_t(lists[r].size())));
      work += int64_t(lists[r].size()) * H * D * 2;
    }
    for (int64_t b = 0; b < B; ++b) {
      int64_t chunks = 0;
      for (int64_t m = 0; m < M; ++m) chunks = std::max(chunks, ab_chunk::chunks_of(int64_t(lists[b * M + m].size())));
      for (int64_t kv = 0; kv < Hkv; ++kv)
        for (int64_t c = 0; c < chunks; ++c) items.push_back((b * Hkv + kv) * most_chunks + c);
    }
  } else {
    work = B * M * std::min<int64_t>(start + M, window > 0 ? window : start + M) * H * D * 2;
  }
  // partials (split): m_c, l_c at ((b·M + m)·H + h)·most_chunks + c; u_c at that · D
  std::vector<float> maxes, sums, us;
  if (split) {
    maxes.resize(B * M * H * most_chunks);
    sums.resize(maxes.size());
    us.resize(maxes.size() * D);
  }
  const int64_t count = split ? int64_t(items.size()) : B * Hkv * M;
  std::atomic<int64_t> next{0};
  auto job = [&]() {
    std::vector<const float*> qs(G);
    std::vector<float*> outs(G);
    std::vector<int64_t> keys;
    for (int64_t index; (index = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
      if (split) {
        const int64_t item = items[index], c = item % most_chunks;
        const int64_t kv = (item / most_chunks) % Hkv, b = item / most_chunks / Hkv;
        for (int64_t m = 0; m < M; ++m) {
          const std::vector<int64_t>& row = lists[b * M + m];
          if (ab_chunk::chunks_of(int64_t(row.size())) <= c) continue;
          heads_of(b, kv, m, qs, outs);
          const int64_t slot = ((b * M + m) * H + kv * G) * most_chunks + c;
          ab_chunk::chunk_of_row(qs.data(), G, cache_of(b, kv), row.data(), int64_t(row.size()), c, D, scale_f, vector,
                                 Partial{maxes.data() + slot, sums.data() + slot, most_chunks, us.data() + slot * D,
                                         most_chunks * D});
        }
      } else {
        const int64_t m = index % M, kv = (index / M) % Hkv, b = index / M / Hkv;
        keys_of(b, m, keys);
        if (keys.empty()) {
          zeros(b, m, kv);
          continue;
        }
        heads_of(b, kv, m, qs, outs);
        ab_chunk::row(qs.data(), G, cache_of(b, kv), keys.data(), int64_t(keys.size()), D, scale_f, vector,
                      outs.data());
      }
    }
  };
  int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  threads = std::max<int64_t>(1, std::min<int64_t>({threads, count, std::max<int64_t>(1, work >> 18)}));
  ab_pool::Pool::get().run(threads - 1, job);
  if (split) {  // each row's heads: its chunks' partials in chunk order (a few hundred operations a head)
    for (int64_t r = 0; r < B * M; ++r) {
      const int64_t chunks = ab_chunk::chunks_of(int64_t(lists[r].size()));
      for (int64_t h = 0; h < H; ++h) {
        float* o = op + (r * H + h) * D;
        const int64_t slot = (r * H + h) * most_chunks;
        if (chunks == 0) {
          std::fill(o, o + D, 0.0f);
        } else {
          ab_chunk::combine(maxes.data() + slot, sums.data() + slot, us.data() + slot * D, D, chunks, D, o);
        }
      }
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(assisted_backends, m) {
  m.def("cache_attention(Tensor q, Tensor k, Tensor v, Tensor? allowed, int start, int window, float scale, "
        "int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(assisted_backends, CPU, m) {
  m.impl("cache_attention", &cache_attention);
}
