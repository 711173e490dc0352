// Block-quantized linear layers on integer dot products, batch-invariant by construction.
//
//   y[m, n] = Σ_g  (S[n, g] · d_x[m, b(g)]) · I[m, n, g]   (+ Z[n, g] · z_x[m, b(g)])      g ascending
//   I[m, n, g] = Σ_{k ∈ g} v[n, k] · q_x[m, k]                                              (int32, exact)
//
// W [N, K] is held as small integers v in groups of G ∈ {16, 32} columns with a float scale S and an
// optional zero Z per (row, group); x [M, K] is quantized per row in blocks of 32 columns
// (q_x int8 ∈ [−127, 127], d_x = amax / 127, z_x = d_x · Σ_{k ∈ block} q_x). The integer sums are exact
// whatever the instruction set (AVX-512 VNNI, AVX-VNNI, AVX2, scalar); the float sum over groups runs in
// one fixed order per output element, in separate fp32 multiplies and adds (built with
// -ffp-contract=off, no FMA), so row m of a call over M rows equals that row alone, bit for bit, on
// every path, and every path equals the others and the plain-PyTorch reference of the same formula.
//
// Stored form (made by assisted_backends/quantized/blocks.py), N padded to tiles of 16 rows:
//   codes  uint8 [T, groups, G·16 / (8 / bits)]  per tile and group, chunks of 4 columns x 16 rows:
//          byte c·64 + l·4 + j holds column 4c + j of row l (bits 8: u = v + 128; bits 4: the low
//          nibble holds q of column 4c + j, the high nibble column 16 + 4c + j, v = q − offset)
//   d      fp16 [T, supers, 16]   scale of a super-block of `sb` groups       S = d · sc  (sc if given)
//   dmin   fp16 [T, supers, 16]   optional                                    Z = dmin · mn (mn if given)
//   sc, mn int8 [T, groups, 16]   optional per-group multipliers (K-quants)
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "cpu_features.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

constexpr int kTile = 16;   // output rows per tile
constexpr int kBlock = 32;  // activation quantization block
constexpr int kRowsPerPass = 8;
constexpr int64_t kPrefetch = 6144;  // bytes ahead in the weight stream (prefetching hides memory behind the dot products)

enum Isa : int64_t { kScalar = 0, kAvx2 = 1, kAvxVnni = 2, kAvx512Vnni = 3 };

struct Weights {
  const uint8_t* codes;
  const uint16_t* d;
  const uint16_t* dmin;  // nullptr: no zeros
  const int8_t* sc;      // nullptr: S = d
  const int8_t* mn;      // nullptr: Z = dmin
  int64_t n, k, groups, supers;
  int bits, group, sb, offset;
  int64_t group_bytes() const { return bits == 4 ? 256 : int64_t(group) * kTile; }
};

struct Activations {
  const int8_t* q;       // [M, K]
  const float* dx;       // [M, K/32]
  const float* zx;       // [M, K/32]
  const int32_t* bsum;   // [M, K/16] sums of q over 16 columns
  int64_t m, k;
};

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) { mantissa <<= 1; --exponent; }
      bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline int32_t group_bsum(const Activations& a, int64_t row, int64_t g, int group) {
  const int32_t* b = a.bsum + row * (a.k / 16);
  return group == 16 ? b[g] : b[2 * g] + b[2 * g + 1];
}

// ---- activation quantization (one row at a time; independent of M by construction) -------------------

// A block holding a NaN or an infinity gets d_x = NaN and q_x = 0, so every output of the row is NaN (the dense
// product gives NaN or ±inf there); a block whose 1 / d_x overflows (max |x| below ~3.7e-37) gets q_x = 0.
void quantize_row(const float* x, int64_t k, int8_t* q, float* dx, float* zx, int32_t* bsum) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < kBlock; ++j) {
      amax = std::max(amax, std::fabs(xb[j]));
      finite = finite && std::isfinite(xb[j]);
    }
    const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    float id = finite && d != 0.0f ? 1.0f / d : 0.0f;
    if (!std::isfinite(id)) id = 0.0f;
    int32_t halves[2] = {0, 0};
    for (int j = 0; j < kBlock; ++j) {
      float r = finite ? std::nearbyint(xb[j] * id) : 0.0f;
      r = std::min(127.0f, std::max(-127.0f, r));
      const int8_t v = int8_t(r);
      q[b * kBlock + j] = v;
      halves[j / 16] += v;
    }
    bsum[2 * b] = halves[0];
    bsum[2 * b + 1] = halves[1];
    dx[b] = d;
    zx[b] = d * float(halves[0] + halves[1]);
  }
}

// ---- scalar path: the formula as written (also the reference for the vector paths) ----------------------

float scale_of(const Weights& w, int64_t t, int64_t g, int lane) {
  float s = half_to_float(w.d[(t * w.supers + g / w.sb) * kTile + lane]);
  if (w.sc) s = s * float(w.sc[(t * w.groups + g) * kTile + lane]);
  return s;
}

float zero_of(const Weights& w, int64_t t, int64_t g, int lane) {
  float z = half_to_float(w.dmin[(t * w.supers + g / w.sb) * kTile + lane]);
  if (w.mn) z = z * float(w.mn[(t * w.groups + g) * kTile + lane]);
  return z;
}

int value_of(const Weights& w, const uint8_t* tile_group, int lane, int col) {
  if (w.bits == 8) return int(tile_group[(col / 4) * 64 + lane * 4 + col % 4]) - 128;
  const int high = col >= 16, c = col % 16;
  const uint8_t byte = tile_group[(c / 4) * 64 + lane * 4 + c % 4];
  return int(high ? byte >> 4 : byte & 0x0F) - w.offset;
}

void tile_scalar(const Weights& w, const Activations& a, int64_t t, int64_t m0, int64_t rows, float* y) {
  const int64_t blocks = a.k / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    for (int lane = 0; lane < kTile; ++lane) {
      const int64_t n = t * kTile + lane;
      if (n >= w.n) break;
      float acc = 0.0f;
      for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* tg = w.codes + (t * w.groups + g) * w.group_bytes();
        const int8_t* xq = a.q + m * a.k + g * w.group;
        int32_t isum = 0;
        for (int col = 0; col < w.group; ++col) isum += value_of(w, tg, lane, col) * int32_t(xq[col]);
        const int64_t b = g * w.group / kBlock;
        acc = acc + (scale_of(w, t, g, lane) * a.dx[m * blocks + b]) * float(isum);
        if (w.dmin) acc = acc + zero_of(w, t, g, lane) * a.zx[m * blocks + b];
      }
      y[m * w.n + n] = acc;
    }
  }
}

// ---- AVX-512 VNNI: 16 rows of a tile in one register, u8 x s8 dot products of 4 columns ----------------

#define AB_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,avx2,fma")))

AB_AVX512 inline __m512 scales512(const uint16_t* d, const int8_t* sc) {
  __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d)));
  if (sc) s = _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)))));
  return s;
}

template <int BITS, int ROWS>
AB_AVX512 void tile_avx512(const Weights& w, const Activations& a, int64_t t, int64_t m0, float* y) {
  constexpr int kChunks = 8;  // 32 columns; a 16-column group uses the first 4
  const int chunks = BITS == 4 ? 8 : w.group / 4;
  const int64_t blocks = a.k / kBlock;
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t group_bytes = w.group_bytes();
  for (int64_t g = 0; g < w.groups; ++g) {
    const uint8_t* tg = w.codes + (t * w.groups + g) * group_bytes;
    for (int64_t line = 0; line < group_bytes; line += 64) _mm_prefetch(reinterpret_cast<const char*>(tg + kPrefetch + line), _MM_HINT_T0);
    __m512i wv[kChunks];
    if (BITS == 4) {
      for (int c = 0; c < 4; ++c) {
        const __m512i packed = _mm512_loadu_si512(tg + 64 * c);
        wv[c] = _mm512_and_si512(packed, low);
        wv[c + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
      }
    } else {
      for (int c = 0; c < chunks; ++c) wv[c] = _mm512_loadu_si512(tg + 64 * c);
    }
    const __m512 s = scales512(w.d + (t * w.supers + g / w.sb) * kTile, w.sc ? w.sc + (t * w.groups + g) * kTile : nullptr);
    __m512 z = _mm512_setzero_ps();
    if (w.dmin) z = scales512(w.dmin + (t * w.supers + g / w.sb) * kTile, w.mn ? w.mn + (t * w.groups + g) * kTile : nullptr);
    const int correction = BITS == 8 ? 128 : w.offset;
    const int64_t b = g * w.group / kBlock;
    for (int r = 0; r < ROWS; ++r) {
      const int64_t m = m0 + r;
      const int8_t* xq = a.q + m * a.k + g * w.group;
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int c = 0; c + 1 < chunks; c += 2) {
        int32_t x0, x1;
        std::memcpy(&x0, xq + 4 * c, 4);
        std::memcpy(&x1, xq + 4 * c + 4, 4);
        s0 = _mm512_dpbusd_epi32(s0, wv[c], _mm512_set1_epi32(x0));
        s1 = _mm512_dpbusd_epi32(s1, wv[c + 1], _mm512_set1_epi32(x1));
      }
      __m512i isum = _mm512_add_epi32(s0, s1);
      if (correction) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(correction * group_bsum(a, m, g, w.group)));
      const __m512 term = _mm512_mul_ps(_mm512_mul_ps(s, _mm512_set1_ps(a.dx[m * blocks + b])), _mm512_cvtepi32_ps(isum));
      acc[r] = _mm512_add_ps(acc[r], term);
      if (w.dmin) acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(z, _mm512_set1_ps(a.zx[m * blocks + b])));
    }
  }
  const int64_t valid = std::min<int64_t>(kTile, w.n - t * kTile);
  const __mmask16 mask = valid == kTile ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
  for (int r = 0; r < ROWS; ++r) _mm512_mask_storeu_ps(y + (m0 + r) * w.n + t * kTile, mask, acc[r]);
}

// ---- AVX2 / AVX-VNNI: two halves of 8 rows (block_tile_avx2.inc, compiled once per instruction set) -----

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
constexpr bool kVnni = false;
#define AB_WITH_VNNI 0
#include "block_tile_avx2.inc"
#undef AB_WITH_VNNI
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
namespace avxvnni {
constexpr bool kVnni = true;
#define AB_WITH_VNNI 1
#include "block_tile_avx2.inc"
#undef AB_WITH_VNNI
}  // namespace avxvnni
#pragma GCC pop_options

// ---- dispatch --------------------------------------------------------------------------------------------

using TileFn = void (*)(const Weights&, const Activations&, int64_t, int64_t, float*);

#define AB_ROW_TABLE(NAME, FN)                                                                              \
  template <int BITS>                                                                                       \
  TileFn NAME(int rows) {                                                                                   \
    switch (rows) {                                                                                         \
      case 1: return FN<BITS, 1>;                                                                           \
      case 2: return FN<BITS, 2>;                                                                           \
      case 3: return FN<BITS, 3>;                                                                           \
      case 4: return FN<BITS, 4>;                                                                           \
      case 5: return FN<BITS, 5>;                                                                           \
      case 6: return FN<BITS, 6>;                                                                           \
      case 7: return FN<BITS, 7>;                                                                           \
      default: return FN<BITS, 8>;                                                                          \
    }                                                                                                       \
  }

AB_ROW_TABLE(pick_avx512, tile_avx512)
AB_ROW_TABLE(pick_avx2, avx2::tile)
AB_ROW_TABLE(pick_avxvnni, avxvnni::tile)

TileFn pick(int64_t isa, int bits, int rows) {
  if (isa == kAvx512Vnni) return bits == 4 ? pick_avx512<4>(rows) : pick_avx512<8>(rows);
  if (isa == kAvxVnni) return bits == 4 ? pick_avxvnni<4>(rows) : pick_avxvnni<8>(rows);
  return bits == 4 ? pick_avx2<4>(rows) : pick_avx2<8>(rows);
}

int64_t best_isa() { return ab_cpu::best_of(ab_cpu::paths()); }

// The path a call runs: the CPU's best (isa < 0) or the one named, which this CPU must run (checked on its own
// flags: a path the CPU lacks is an error, never an illegal instruction).
int64_t checked_isa(int64_t isa) {
  if (isa < 0) return best_isa();
  TORCH_CHECK(isa < ab_cpu::kPaths && (ab_cpu::paths() >> isa) & 1, "block kernels: this CPU does not run the ",
              ab_cpu::path_name(isa), " path (it runs ", ab_cpu::path_list(ab_cpu::paths()),
              "): set ASSISTED_BACKENDS_KERNEL_ISA to one of these, or unset it");
  return isa;
}

// ---- ops --------------------------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % kBlock == 0, "block kernels: x must be [M, K] with K % 32 == 0");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t m = xf.size(0), k = xf.size(1);
  at::Tensor q = at::empty({m, k}, at::kChar);
  at::Tensor dx = at::empty({m, k / kBlock}, at::kFloat);
  at::Tensor zx = at::empty({m, k / kBlock}, at::kFloat);
  at::Tensor bsum = at::empty({m, k / 16}, at::kInt);
  const float* xp = xf.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float *dp = dx.data_ptr<float>(), *zp = zx.data_ptr<float>();
  int32_t* bp = bsum.data_ptr<int32_t>();
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      quantize_row(xp + r * k, k, qp + r * k, dp + r * (k / kBlock), zp + r * (k / kBlock), bp + r * (k / 16));
  });
  return {q, dx, zx, bsum};
}

Weights weights_of(const at::Tensor& codes, const at::Tensor& d, const c10::optional<at::Tensor>& dmin,
                   const c10::optional<at::Tensor>& sc, const c10::optional<at::Tensor>& mn, int64_t n, int64_t k,
                   int64_t bits, int64_t group, int64_t sb, int64_t offset) {
  TORCH_CHECK(bits == 4 || bits == 8, "block kernels: bits must be 4 or 8");
  TORCH_CHECK(group == 32 || (group == 16 && bits == 8), "block kernels: group must be 32 (or 16 with 8 bits)");
  TORCH_CHECK(bits == 4 || offset == 0, "block kernels: an 8-bit weight stores v + 128, offset must be 0");
  TORCH_CHECK(k % kBlock == 0 && k % (group * sb) == 0, "block kernels: K must be a multiple of 32 and of the super-block");
  const int64_t tiles = (n + kTile - 1) / kTile, groups = k / group, supers = groups / sb;
  const int64_t group_bytes = bits == 4 ? 256 : group * kTile;
  TORCH_CHECK(codes.is_contiguous() && codes.scalar_type() == at::kByte && codes.numel() == tiles * groups * group_bytes,
              "block kernels: codes has the wrong size or type");
  TORCH_CHECK(d.is_contiguous() && d.scalar_type() == at::kHalf && d.numel() == tiles * supers * kTile,
              "block kernels: d has the wrong size or type");
  Weights w{};
  w.codes = codes.data_ptr<uint8_t>();
  w.d = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  if (dmin.has_value() && dmin->defined()) {
    TORCH_CHECK(dmin->is_contiguous() && dmin->numel() == d.numel() && dmin->scalar_type() == at::kHalf, "block kernels: dmin");
    w.dmin = reinterpret_cast<const uint16_t*>(dmin->data_ptr<at::Half>());
  }
  for (auto [tensor, target] : {std::make_pair(&sc, &w.sc), std::make_pair(&mn, &w.mn)}) {
    if (tensor->has_value() && (*tensor)->defined()) {
      TORCH_CHECK((*tensor)->is_contiguous() && (*tensor)->numel() == tiles * groups * kTile &&
                      (*tensor)->scalar_type() == at::kChar, "block kernels: sc / mn have the wrong size or type");
      *target = (*tensor)->data_ptr<int8_t>();
    }
  }
  w.n = n; w.k = k; w.groups = groups; w.supers = supers;
  w.bits = int(bits); w.group = int(group); w.sb = int(sb); w.offset = int(offset);
  return w;
}

at::Tensor block_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d,
                        const c10::optional<at::Tensor>& dmin, const c10::optional<at::Tensor>& sc,
                        const c10::optional<at::Tensor>& mn, const c10::optional<at::Tensor>& bias, int64_t n,
                        int64_t k, int64_t bits, int64_t group, int64_t sb, int64_t offset, int64_t isa) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == k, "block kernels: x must be [..., ", k, "], got ", x.sizes());
  const Weights w = weights_of(codes, d, dmin, sc, mn, n, k, bits, group, sb, offset);
  const at::Tensor rows = x.reshape({-1, k});
  const int64_t m = rows.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor y = at::empty({m, n}, at::kFloat);
  if (m > 0) {
    auto [q, dx, zx, bsum] = quantize_activations(rows);
    const Activations a{q.data_ptr<int8_t>(), dx.data_ptr<float>(), zx.data_ptr<float>(), bsum.data_ptr<int32_t>(), m, k};
    const int64_t chosen = checked_isa(isa);
    float* yp = y.data_ptr<float>();
    const int64_t tiles = (n + kTile - 1) / kTile;
    // At least ~64 KB of weight work a thread: a small layer's tiles are not worth a second thread's wake-up.
    const int64_t work_per_tile = w.groups * w.group_bytes() * (1 + m / 4);
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, work_per_tile));
    at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t m0 = 0; m0 < m; m0 += kRowsPerPass) {
          const int rows_now = int(std::min<int64_t>(kRowsPerPass, m - m0));
          if (chosen == kScalar) {
            tile_scalar(w, a, t, m0, rows_now, yp);
          } else {
            pick(chosen, w.bits, rows_now)(w, a, t, m0, yp);
          }
        }
      }
    });
    if (bias.has_value() && bias->defined()) {
      TORCH_CHECK(bias->numel() == n, "block kernels: bias must have ", n, " values");
      y.add_(bias->to(at::kFloat));  // fp32 sum + fp32 bias: one rounding, as `y + bias` in PyTorch
    }
  }
  y = y.view(shape);
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

int64_t cpu_isa() { return best_isa(); }
int64_t cpu_features() { return ab_cpu::features(); }
int64_t cpu_paths(int64_t features) { return ab_cpu::paths_for(features < 0 ? ab_cpu::features() : features); }

}  // namespace

TORCH_LIBRARY(assisted_backends, m) {
  m.def("block_linear(Tensor x, Tensor codes, Tensor d, Tensor? dmin, Tensor? sc, Tensor? mn, Tensor? bias, int n, "
        "int k, int bits, int group, int sb, int offset, int isa) -> Tensor");
  m.def("block_quantize_activations(Tensor x) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("block_cpu_isa() -> int", &cpu_isa);
  m.def("block_cpu_features() -> int", &cpu_features);
  m.def("block_cpu_paths(int features) -> int", &cpu_paths);
}

TORCH_LIBRARY_IMPL(assisted_backends, CPU, m) {
  m.impl("block_linear", &block_linear);
  m.impl("block_quantize_activations", &quantize_activations);
}
