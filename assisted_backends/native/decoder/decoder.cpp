// A decoder step in one call: every layer of a Llama-family model around the package's kernels.
//
// For the rows r = (b, m) of one forward (B rows of M new tokens each, position p[b, m], cache slot s0 + m):
//   h_r   = E[token_r]                                              embedding row, dequantized exactly
//   per layer l:
//     x     = RMSNorm(h; w_in)                                      Σ x² in 8 lanes over d, then a fixed tree
//     q,k,v = x W_qkvᵀ (+ b)                                        block_linear (one fused call or three)
//     q,k   = RMSNorm per head (Qwen3) ; rotary(p)                  q·cos + rotate_half(q)·sin, no FMA
//     K[l, b, :, s0 + m] = k ; V[...] = v                           the row's own preallocated cache (fp32, or
//                                                                   rounded to fp16 / bf16: a half cache)
//     a     = Σ_t softmax_t(q · K_t · scale) V_t                    cache_attention: keys t < s0 + m + 1, in fixed
//                                                                   chunks of the key list, combined in order
//     h     = h + a W_oᵀ
//     x     = RMSNorm(h; w_post)
//     h     = h + (SiLU(x W_gᵀ) · x W_uᵀ) W_dᵀ                      SiLU(g) = g / (1 + exp(−g)), one polynomial exp
//   logits  = RMSNorm(h; w_final) W_headᵀ                           for the last `keep` rows of each b only
// On request (`taps`) it copies h as it enters the layers asked for, or leaves the last one, for every row: the
// features an EAGLE head drafts from, out of the same call.
// Every op computes a row alone in one fixed order of fp32 operations (built with -ffp-contract=off), and the
// linear kernel (block_linear, reached through the dispatcher) is batch-invariant, so a verify pass over M rows
// returns, row by row, what M one-token steps return. The kernels run their own threads: block_linear and the
// attention (cache_attention, csrc/chunk_attention.h: the row-attention kernel's arithmetic on the cache in place,
// split over key chunks at any context length), both reached through the dispatcher; the ops between are a few KB
// a row, done on the calling thread for a step or a verify pass and in parallel over rows only for a long prefill.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <immintrin.h>

#include "../csrc/block_layout.h"
#include "../csrc/row_math.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using OptTensor = std::optional<at::Tensor>;
using LinearFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                            const OptTensor&, const OptTensor&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t);
using AttentionFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t,
                               int64_t, double, int64_t);

constexpr int kTile = 16;

using ab_math::exp_avx2;       // ../csrc/row_math.h: the arithmetic shared with the kernels' library
using ab_math::exp_scalar;
using ab_math::half_to_float;
using ab_math::tree8;

// One block-quantized matrix W [n, k] in the kernels' layout (quantized/blocks.py), with its optional bias.
struct Linear {
  at::Tensor codes, d;
  OptTensor dmin, sc, mn, bias;
  int64_t n = 0, k = 0, bits = 0, group = 0, sb = 0, offset = 0;

  // Row `row` of W in fp32: S·v + Z computed in double and rounded once (BlockWeight.rows' values).
  void dequantize_row(int64_t row, float* out) const {
    const int64_t t = row / kTile, lane = row % kTile, groups = k / group, supers = groups / sb;
    const uint8_t* tile = codes.data_ptr<uint8_t>() + t * groups * ab_blocks::group_bytes_of(int(bits), int(group));
    const uint16_t* dp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
    const uint16_t* mp = dmin ? reinterpret_cast<const uint16_t*>(dmin->data_ptr<at::Half>()) : nullptr;
    const int8_t* scp = sc ? sc->data_ptr<int8_t>() : nullptr;
    const int8_t* mnp = mn ? mn->data_ptr<int8_t>() : nullptr;
    for (int64_t g = 0; g < groups; ++g) {
      float s = half_to_float(dp[(t * supers + g / sb) * kTile + lane]);
      if (scp) s = s * float(scp[(t * groups + g) * kTile + lane]);
      float z = 0.0f;
      if (mp) {
        z = half_to_float(mp[(t * supers + g / sb) * kTile + lane]);
        if (mnp) z = z * float(mnp[(t * groups + g) * kTile + lane]);
      }
      for (int64_t col = 0; col < group; ++col) {
        const int v = ab_blocks::stored_value(tile, int(bits), int(group), int(offset), g, int(lane), int(col));
        double w = double(v) * double(s);
        if (mp) w = w + double(z);
        out[g * group + col] = float(w);
      }
    }
  }
};

// A Linear's fields against its tensors, as the kernels' `weights_of` checks them: `dequantize_row` reads the
// embedding table here without going through the kernel, so a table that does not hold n x k values is refused
// before any row is read. `what` names it in the message; n x k: the shape the model needs (0: not checked).
void check_linear(const Linear& w, const char* what, int64_t n, int64_t k) {
  TORCH_CHECK(w.codes.defined() && w.d.defined(), "decoder: ", what, ": no weight");
  TORCH_CHECK(n == 0 || w.n == n, "decoder: ", what, " has ", w.n, " rows, the model needs ", n);
  TORCH_CHECK(k == 0 || w.k == k, "decoder: ", what, " has ", w.k, " columns, the model needs ", k);
  TORCH_CHECK(w.n >= 1 && w.k >= 1, "decoder: ", what, " is empty");
  TORCH_CHECK(w.bits == 4 || w.bits == 5 || w.bits == 6 || w.bits == 8, "decoder: ", what, ": bits 4, 5, 6 or 8");
  TORCH_CHECK((w.group == 32 || w.group == 16) && w.sb >= 1 && w.k % (w.group * w.sb) == 0,
              "decoder: ", what, ": K must be whole super-blocks of its groups");
  const int64_t tiles = (w.n + kTile - 1) / kTile, groups = w.k / w.group, supers = groups / w.sb;
  TORCH_CHECK(w.codes.is_contiguous() && w.codes.scalar_type() == at::kByte &&
                  w.codes.numel() == tiles * groups * ab_blocks::group_bytes_of(int(w.bits), int(w.group)),
              "decoder: ", what, ": codes have the wrong size or type");
  TORCH_CHECK(w.d.is_contiguous() && w.d.scalar_type() == at::kHalf && w.d.numel() == tiles * supers * kTile,
              "decoder: ", what, ": d has the wrong size or type");
  TORCH_CHECK(!w.dmin || (w.dmin->is_contiguous() && w.dmin->scalar_type() == at::kHalf && w.dmin->numel() == w.d.numel()),
              "decoder: ", what, ": dmin has the wrong size or type");
  for (const OptTensor* t : {&w.sc, &w.mn})
    TORCH_CHECK(!*t || ((*t)->is_contiguous() && (*t)->scalar_type() == at::kChar && (*t)->numel() == tiles * groups * kTile),
                "decoder: ", what, ": sc / mn have the wrong size or type");
  TORCH_CHECK(!w.bias || w.bias->numel() == w.n, "decoder: ", what, ": the bias must have ", w.n, " values");
}

// A norm's multiplier: fp32, `n` values.
void check_norm(const at::Tensor& w, const char* what, int64_t n) {
  TORCH_CHECK(w.defined() && w.dim() == 1 && w.size(0) == n && w.scalar_type() == at::kFloat, "decoder: ", what,
              " must be fp32 [", n, "], got ", w.defined() ? w.sizes() : at::IntArrayRef{});
}

struct Layer {
  std::vector<Linear> qkv;      // one fused [q; k; v] or three
  Linear o;
  std::vector<Linear> gate_up;  // one fused [gate; up] or two
  Linear down;
  at::Tensor input_norm, mlp_norm;       // [D]: before attention, before the MLP
  OptTensor attention_out_norm, mlp_out_norm;  // [D]: on each block's output before the residual (Gemma 3)
  OptTensor q_norm, k_norm;              // [Dh] (Qwen3, Gemma 3)
  int64_t window = 0;                    // > 0: keys t > s − window only (sliding-window layers)
  int64_t table = 0;                     // which rotary table (Gemma 3: 1 for sliding layers)
};

enum Activation : int64_t { kSilu = 0, kGeluTanh = 1 };

// ---- row ops: scalar and AVX2 bodies compute the same operations in the same order -------------------------

#define AB_AVX2 __attribute__((target("avx2,fma")))

AB_AVX2 float sum_squares(const float* x, int64_t n) {
  alignas(32) float lanes[8];
  int64_t i = 0;
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  _mm256_store_ps(lanes, acc);
  for (; i < n; ++i) lanes[i % 8] = lanes[i % 8] + x[i] * x[i];
  return tree8(lanes);
}

// y = w · (x · 1/sqrt(Σx²/n + eps))   (transformers' order: normalize, then the weight)
AB_AVX2 void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float variance = sum_squares(x, n) / float(n);
  const float r = 1.0f / std::sqrt(variance + eps);
  int64_t i = 0;
  const __m256 rv = _mm256_set1_ps(r);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
  for (; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

// out = SiLU(g) · u = (g / (1 + exp(−g))) · u
AB_AVX2 void silu_mul(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(zero, gv));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = (g[i] / (1.0f + exp_scalar(0.0f - g[i]))) * u[i];
}

// out = GELU_tanh(g) · u = 0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³))) · u,  tanh(y) = 1 − 2 / (exp(2y) + 1)
inline float gelu_tanh(float g) {
  const float inner = 0.7978845608028654f * (g + 0.044715f * (g * (g * g)));
  const float t = 1.0f - 2.0f / (exp_scalar(2.0f * inner) + 1.0f);
  return (0.5f * g) * (1.0f + t);
}

AB_AVX2 void gelu_mul(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), half = _mm256_set1_ps(0.5f);
  const __m256 c = _mm256_set1_ps(0.7978845608028654f), a = _mm256_set1_ps(0.044715f);
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 inner = _mm256_mul_ps(c, _mm256_add_ps(gv, _mm256_mul_ps(a, _mm256_mul_ps(gv, _mm256_mul_ps(gv, gv)))));
    const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp_avx2(_mm256_mul_ps(two, inner)), one)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, gv), _mm256_add_ps(one, t)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = gelu_tanh(g[i]) * u[i];
}

AB_AVX2 void add_into(float* h, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(h + i, _mm256_add_ps(_mm256_loadu_ps(h + i), _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) h[i] = h[i] + x[i];
}

// out = x·cos + rotate_half(x)·sin, rotate_half(x) = [−x2, x1]   (transformers' apply_rotary_pos_emb)
inline void rotate(const float* x, const float* cos, const float* sin, int64_t d, float* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
  for (int64_t i = half; i < d; ++i) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

// Row x [d] fp32 into slot `slot` of a cache of type `stored` (fp16 / bf16: rounded to nearest even, as torch's
// .half() / .bfloat16()).
inline void store_row(const float* x, int64_t d, at::ScalarType stored, char* cache, int64_t slot) {
  if (stored == at::kFloat) {
    std::memcpy(reinterpret_cast<float*>(cache) + slot, x, d * sizeof(float));
  } else if (stored == at::kHalf) {
    at::Half* out = reinterpret_cast<at::Half*>(cache) + slot;
    for (int64_t i = 0; i < d; ++i) out[i] = at::Half(x[i]);
  } else {
    at::BFloat16* out = reinterpret_cast<at::BFloat16*>(cache) + slot;
    for (int64_t i = 0; i < d; ++i) out[i] = at::BFloat16(x[i]);
  }
}

// Rows [begin, end) of work that costs `cost` a row: serial below ~16 M operations (a step, a verify pass, a short
// prefill: a fork-join region on a busy core costs a timeslice), in parallel over rows above.
template <typename F>
void over_rows(int64_t rows, int64_t cost, const F& body) {
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 24) / std::max<int64_t>(1, cost));
  if (rows <= grain) {
    body(0, rows);
  } else {
    at::parallel_for(0, rows, grain, body);
  }
}

class Decoder {
 public:
  // embed_scale: the fp32 factor the family multiplies each embedding row by (Gemma 3: √D in fp32); 0: none.
  Decoder(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, double eps,
          double scale, at::Tensor final_norm, Linear embedding, double embed_scale, Linear head, int64_t activation)
      : hidden_(hidden), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), intermediate_(intermediate),
        eps_(float(eps)), scale_(scale), final_norm_(final_norm.contiguous()), embedding_(std::move(embedding)),
        embed_scale_(float(embed_scale)), head_(std::move(head)), activation_(activation) {
    TORCH_CHECK(activation == kSilu || activation == kGeluTanh, "decoder: activation 0 (SiLU) or 1 (GELU tanh)");
    TORCH_CHECK(hidden >= 1 && intermediate >= 1, "decoder: hidden ", hidden, " and intermediate ", intermediate,
                " must be at least 1");
    TORCH_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, "decoder: ", heads, " heads and ", kv_heads,
                " key/value heads: both at least 1, the heads a multiple of the key/value heads");
    TORCH_CHECK(head_dim >= 2 && head_dim % 2 == 0, "decoder: head_dim must be even and at least 2, got ", head_dim);
    check_norm(final_norm_, "the final norm", hidden);
    if (embedding_.codes.defined() || embedding_.n != 0) check_linear(embedding_, "the embedding table", 0, hidden);
    check_linear(head_, "the LM head", 0, hidden);
    linear_.emplace(c10::Dispatcher::singleton().findSchemaOrThrow("assisted_backends::block_linear", "").typed<LinearFn>());
    attention_.emplace(
        c10::Dispatcher::singleton().findSchemaOrThrow("assisted_backends::cache_attention", "").typed<AttentionFn>());
  }

  void add_layer(std::vector<Linear> qkv, Linear o, std::vector<Linear> gate_up, Linear down, at::Tensor input_norm,
                 OptTensor attention_out_norm, at::Tensor mlp_norm, OptTensor mlp_out_norm, OptTensor q_norm,
                 OptTensor k_norm, int64_t window, int64_t table) {
    TORCH_CHECK(qkv.size() == 1 || qkv.size() == 3, "decoder: q/k/v as one fused matrix or three");
    TORCH_CHECK(gate_up.size() == 1 || gate_up.size() == 2, "decoder: gate/up as one fused matrix or two");
    TORCH_CHECK(table == 0 || table == 1, "decoder: rotary table 0 or 1");
    TORCH_CHECK(window >= 0, "decoder: a sliding window of ", window);
    // every matrix's [n, k] against the model's sizes: the step indexes their outputs by these
    const int64_t D = hidden_, Q = heads_ * head_dim_, KV = kv_heads_ * head_dim_, I = intermediate_;
    if (qkv.size() == 1) {
      check_linear(qkv[0], "the fused q/k/v projection", Q + 2 * KV, D);
    } else {
      check_linear(qkv[0], "the q projection", Q, D);
      check_linear(qkv[1], "the k projection", KV, D);
      check_linear(qkv[2], "the v projection", KV, D);
    }
    check_linear(o, "the output projection", D, Q);
    if (gate_up.size() == 1) {
      check_linear(gate_up[0], "the fused gate/up projection", 2 * I, D);
    } else {
      check_linear(gate_up[0], "the gate projection", I, D);
      check_linear(gate_up[1], "the up projection", I, D);
    }
    check_linear(down, "the down projection", D, I);
    input_norm = input_norm.contiguous();
    mlp_norm = mlp_norm.contiguous();
    check_norm(input_norm, "the input norm", D);
    check_norm(mlp_norm, "the MLP norm", D);
    for (OptTensor* t : {&attention_out_norm, &mlp_out_norm}) {
      if (*t) {
        *t = (*t)->contiguous();
        check_norm(**t, "a block's output norm", D);
      }
    }
    for (OptTensor* t : {&q_norm, &k_norm}) {
      if (*t) {
        *t = (*t)->contiguous();
        check_norm(**t, "the q / k norm", head_dim_);
      }
    }
    layers_.push_back(Layer{std::move(qkv), std::move(o), std::move(gate_up), std::move(down), input_norm, mlp_norm,
                            attention_out_norm, mlp_out_norm, q_norm, k_norm, window, table});
  }

  void set_rotary(int64_t table, at::Tensor cos, at::Tensor sin) {  // [P, Dh] each: positions 0..P-1
    TORCH_CHECK(table == 0 || table == 1, "decoder: rotary table 0 or 1");
    TORCH_CHECK(cos.dim() == 2 && cos.size(1) == head_dim_ && sin.sizes() == cos.sizes(), "decoder: rotary tables");
    cos_[table] = cos.to(at::kFloat).contiguous();
    sin_[table] = sin.to(at::kFloat).contiguous();
  }

  int64_t rotary_positions() const {
    int64_t least = cos_[0].defined() ? cos_[0].size(0) : 0;
    for (const Layer& layer : layers_)
      if (layer.table == 1) least = std::min<int64_t>(least, cos_[1].defined() ? cos_[1].size(0) : 0);
    return least;
  }

  // tokens, positions [B, M]; keys / values per layer [B, Hkv, C, Dh] fp32, fp16 or bf16 (one type for all);
  // mask [B, 1, 1, C] bool or none;
  // embedded [B·M, D]: the rows' embeddings where the caller computed them (else the embedding table's rows).
  // taps [J, B·M, D] fp32 (or none): taps[j] receives every row's residual stream h entering layer tap_layers[j]
  // (tap_layers[j] = L: the last layer's output, before the final norm), what an EAGLE head reads as features.
  // Returns logits [B, keep, V] of each b's last `keep` rows (keep = 0: all M).
  at::Tensor step(const at::Tensor& tokens, const at::Tensor& positions, int64_t start, const std::vector<at::Tensor>& keys,
                  const std::vector<at::Tensor>& values, const OptTensor& mask, int64_t keep, int64_t isa,
                  const OptTensor& embedded, const std::vector<int64_t>& tap_layers, const OptTensor& taps) {
    TORCH_CHECK(tokens.dim() == 2 && positions.sizes() == tokens.sizes(), "decoder: tokens and positions are [B, M]");
    TORCH_CHECK(layers() >= 1, "decoder: no layers (add_layer first)");
    TORCH_CHECK(int64_t(keys.size()) == layers() && int64_t(values.size()) == layers(), "decoder: one cache per layer");
    const int64_t B = tokens.size(0), M = tokens.size(1), R = B * M, D = hidden_, Dh = head_dim_;
    const int64_t H = heads_, Hkv = kv_heads_, I = intermediate_;
    TORCH_CHECK(R > 0, "decoder: no rows");
    // each layer's keys and values written and read in place: [B, Hkv, C, Dh], contiguous, one C and one type for all
    const int64_t C = keys[0].dim() == 4 ? keys[0].size(2) : -1;
    const at::ScalarType stored = keys[0].defined() ? keys[0].scalar_type() : at::kFloat;
    TORCH_CHECK(stored == at::kFloat || stored == at::kHalf || stored == at::kBFloat16,
                "decoder: the cache must be float32, float16 or bfloat16, got ", stored);
    for (int64_t l = 0; l < layers(); ++l) {
      for (const at::Tensor* t : {&keys[l], &values[l]}) {
        TORCH_CHECK(t->defined() && t->dim() == 4 && t->size(0) == B && t->size(1) == Hkv && t->size(2) == C &&
                        t->size(3) == Dh && t->scalar_type() == stored && t->is_contiguous(),
                    "decoder: layer ", l, "'s cache must be contiguous ", stored, " [", B, ", ", Hkv, ", C, ", Dh,
                    "] with one C and one type for every layer, got ", t->defined() ? t->sizes() : at::IntArrayRef{});
      }
    }
    float* tapp = nullptr;
    if (!tap_layers.empty()) {
      TORCH_CHECK(taps && taps->scalar_type() == at::kFloat && taps->is_contiguous() &&
                      taps->numel() == int64_t(tap_layers.size()) * R * D,
                  "decoder: taps must be a contiguous fp32 [J, B·M, D] tensor for J tap layers");
      for (int64_t k : tap_layers) TORCH_CHECK(k >= 0 && k <= layers(), "decoder: tap layer ", k, " outside 0..", layers());
      tapp = taps->data_ptr<float>();
    }
    // h into taps[j] wherever tap_layers[j] == l (l = L: after the last layer)
    auto tap = [&](int64_t l, const float* h) {
      for (size_t j = 0; j < tap_layers.size(); ++j)
        if (tap_layers[j] == l) std::memcpy(tapp + int64_t(j) * R * D, h, R * D * sizeof(float));
    };
    const auto began = Clock::now();
    const int64_t capacity = keys[0].size(2);
    TORCH_CHECK(start >= 0 && start + M <= capacity, "decoder: the cache holds ", capacity, " positions, not ", start + M);
    const at::Tensor tok = tokens.to(at::kLong).contiguous(), pos = positions.to(at::kLong).contiguous();
    const int64_t* tp = tok.data_ptr<int64_t>();
    const int64_t* pp = pos.data_ptr<int64_t>();
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(embedded || (tp[r] >= 0 && tp[r] < embedding_.n), "decoder: token id ", tp[r], " outside the vocabulary");
      TORCH_CHECK(pp[r] >= 0 && pp[r] < rotary_positions(), "decoder: position ", pp[r], " outside the rotary table");
    }
    at::Tensor h;
    if (embedded) {
      TORCH_CHECK(embedded->numel() == R * D, "decoder: embedded rows must be [B·M, D]");
      h = embedded->to(at::kFloat).reshape({R, D}).clone();
    } else {
      TORCH_CHECK(embedding_.codes.defined(), "decoder: no embedding table: pass the embedded rows");
      h = at::empty({R, D}, at::kFloat);
    }
    float* hp = h.data_ptr<float>();
    if (!embedded) {
      over_rows(R, D * 4, [&](int64_t b0, int64_t b1) {
        for (int64_t r = b0; r < b1; ++r) {
          embedding_.dequantize_row(tp[r], hp + r * D);
          if (embed_scale_ != 0.0f)  // the row times the fp32 factor, one rounding (as `rows * embed_scale`)
            for (int64_t i = 0; i < D; ++i) hp[r * D + i] = hp[r * D + i] * embed_scale_;
        }
      });
    }
    at::Tensor x = at::empty({R, D}, at::kFloat);
    at::Tensor q = at::empty({B, H, M, Dh}, at::kFloat);
    at::Tensor act = at::empty({R, I}, at::kFloat);
    float *xp = x.data_ptr<float>(), *qp = q.data_ptr<float>(), *ap = act.data_ptr<float>();
    // the columns each batch row may attend ([B, C], padding), where the caller masks any
    at::Tensor allowed;
    if (mask) {
      TORCH_CHECK(mask->numel() == B * capacity, "decoder: the mask must be [B, 1, 1, C]");
      allowed = mask->to(at::kBool).contiguous();
    }
    const OptTensor allowed_opt = allowed.defined() ? OptTensor(allowed.view({B, capacity})) : std::nullopt;
    for (int64_t l = 0; l < layers(); ++l) {
      const Layer& layer = layers_[l];
      if (tapp) tap(l, hp);
      const float* cosp = cos_[layer.table].data_ptr<float>();
      const float* sinp = sin_[layer.table].data_ptr<float>();
      norm_rows(hp, layer.input_norm.data_ptr<float>(), R, D, xp);
      // q, k, v: pointers and row strides into one fused output or three
      std::vector<at::Tensor> outs;
      for (const Linear& w : layer.qkv) outs.push_back(run(w, x, isa));
      const float *qs, *ks, *vs;
      int64_t qstride, kstride, vstride;
      if (outs.size() == 1) {
        qs = outs[0].data_ptr<float>(); ks = qs + H * Dh; vs = ks + Hkv * Dh;
        qstride = kstride = vstride = outs[0].size(1);
      } else {
        qs = outs[0].data_ptr<float>(); ks = outs[1].data_ptr<float>(); vs = outs[2].data_ptr<float>();
        qstride = outs[0].size(1); kstride = outs[1].size(1); vstride = outs[2].size(1);
      }
      char* kc = static_cast<char*>(keys[l].data_ptr());
      char* vc = static_cast<char*>(values[l].data_ptr());
      const float* qn = layer.q_norm ? layer.q_norm->data_ptr<float>() : nullptr;
      const float* kn = layer.k_norm ? layer.k_norm->data_ptr<float>() : nullptr;
      over_rows(R, (H + 2 * Hkv) * Dh * 2, [&](int64_t r0, int64_t r1) {
        std::vector<float> tmp(Dh), rotated(Dh);
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t b = r / M, m = r % M, p = pp[r];
          const float* c = cosp + p * Dh;
          const float* s = sinp + p * Dh;
          for (int64_t hh = 0; hh < H; ++hh) {
            const float* src = qs + r * qstride + hh * Dh;
            if (qn) { rms_norm(src, qn, Dh, eps_, tmp.data()); src = tmp.data(); }
            rotate(src, c, s, Dh, qp + ((b * H + hh) * M + m) * Dh);
          }
          for (int64_t hh = 0; hh < Hkv; ++hh) {
            const float* src = ks + r * kstride + hh * Dh;
            if (kn) { rms_norm(src, kn, Dh, eps_, tmp.data()); src = tmp.data(); }
            const int64_t slot = ((b * Hkv + hh) * capacity + start + m) * Dh;
            rotate(src, c, s, Dh, rotated.data());
            store_row(rotated.data(), Dh, stored, kc, slot);
            store_row(vs + r * vstride + hh * Dh, Dh, stored, vc, slot);
          }
        }
      });
      outs.clear();
      const auto attention_began = Clock::now();
      const at::Tensor attended = attention_->call(q, keys[l], values[l], allowed_opt, start, layer.window, scale_, isa)
                                      .view({R, H * Dh});  // [B, M, H, Dh]
      attention_ns_ += elapsed(attention_began);
      add_block(hp, run(layer.o, attended, isa), layer.attention_out_norm, R, D);
      norm_rows(hp, layer.mlp_norm.data_ptr<float>(), R, D, xp);
      const bool fused = layer.gate_up.size() == 1;
      const at::Tensor g = run(layer.gate_up[0], x, isa);
      const at::Tensor u = fused ? g : run(layer.gate_up[1], x, isa);
      const float* gp = g.data_ptr<float>();
      const float* up = fused ? gp + I : u.data_ptr<float>();
      const int64_t stride = fused ? 2 * I : I;
      over_rows(R, I * 8, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          if (activation_ == kSilu) {
            silu_mul(gp + r * stride, up + r * stride, I, ap + r * I);
          } else {
            gelu_mul(gp + r * stride, up + r * stride, I, ap + r * I);
          }
        }
      });
      add_block(hp, run(layer.down, act, isa), layer.mlp_out_norm, R, D);
    }
    if (tapp) tap(layers(), hp);
    const int64_t kept = (keep <= 0 || keep > M) ? M : keep;
    at::Tensor last = at::empty({B * kept, D}, at::kFloat);
    float* lp = last.data_ptr<float>();
    const float* fn = final_norm_.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < kept; ++j) rms_norm(hp + (b * M + M - kept + j) * D, fn, D, eps_, lp + (b * kept + j) * D);
    at::Tensor logits = run(head_, last, isa).view({B, kept, head_.n});
    total_ns_ += elapsed(began);
    ++steps_;
    return logits;
  }

  // Time inside the kernels' calls and in whole steps since the last reset: (linear ns, attention ns, step ns, steps).
  std::tuple<int64_t, int64_t, int64_t, int64_t> timings() const { return {linear_ns_, attention_ns_, total_ns_, steps_}; }
  void reset_timings() { linear_ns_ = attention_ns_ = total_ns_ = steps_ = 0; }

  int64_t layers() const { return int64_t(layers_.size()); }

 private:
  using Clock = std::chrono::steady_clock;
  static int64_t elapsed(Clock::time_point since) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count();
  }

  at::Tensor run(const Linear& w, const at::Tensor& x, int64_t isa) {
    const auto began = Clock::now();
    at::Tensor y = linear_->call(x, w.codes, w.d, w.dmin, w.sc, w.mn, w.bias, w.n, w.k, w.bits, w.group, w.sb, w.offset, isa);
    linear_ns_ += elapsed(began);
    return y;
  }

  void norm_rows(const float* h, const float* w, int64_t rows, int64_t d, float* out) const {
    over_rows(rows, d * 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) rms_norm(h + r * d, w, d, eps_, out + r * d);
    });
  }

  // h += y, or h += RMSNorm(y; w) where the block's output has a norm of its own (Gemma 3)
  void add_block(float* h, const at::Tensor& y, const OptTensor& norm, int64_t rows, int64_t d) const {
    float* yp = y.data_ptr<float>();
    const float* w = norm ? norm->data_ptr<float>() : nullptr;
    over_rows(rows, d * 2, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (w) rms_norm(yp + r * d, w, d, eps_, yp + r * d);  // in place: the sum is taken before any write
        add_into(h + r * d, yp + r * d, d);
      }
    });
  }

  int64_t hidden_, heads_, kv_heads_, head_dim_, intermediate_;
  float eps_;
  double scale_;
  at::Tensor final_norm_, cos_[2], sin_[2];
  Linear embedding_;
  float embed_scale_;
  Linear head_;
  int64_t activation_;
  std::vector<Layer> layers_;
  int64_t linear_ns_ = 0, attention_ns_ = 0, total_ns_ = 0, steps_ = 0;
  std::optional<c10::TypedOperatorHandle<LinearFn>> linear_;
  std::optional<c10::TypedOperatorHandle<AttentionFn>> attention_;
};

Linear no_linear() { return Linear(); }

Linear make_linear(at::Tensor codes, at::Tensor d, OptTensor dmin, OptTensor sc, OptTensor mn, OptTensor bias, int64_t n,
                   int64_t k, int64_t bits, int64_t group, int64_t sb, int64_t offset) {
  Linear w;
  w.codes = codes; w.d = d; w.dmin = dmin; w.sc = sc; w.mn = mn;
  w.bias = bias ? OptTensor(bias->to(at::kFloat).contiguous()) : std::nullopt;
  w.n = n; w.k = k; w.bits = bits; w.group = group; w.sb = sb; w.offset = offset;
  return w;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<Linear>(m, "Linear");
  m.def("make_linear", &make_linear);
  m.def("no_linear", &no_linear);
  pybind11::class_<Decoder>(m, "Decoder")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double, at::Tensor, Linear, double,
                          Linear, int64_t>())
      .def("add_layer", &Decoder::add_layer)
      .def("set_rotary", &Decoder::set_rotary)
      .def("rotary_positions", &Decoder::rotary_positions)
      .def("layers", &Decoder::layers)
      .def("timings", &Decoder::timings)
      .def("reset_timings", &Decoder::reset_timings)
      .def("step", &Decoder::step, pybind11::call_guard<pybind11::gil_scoped_release>());
}
