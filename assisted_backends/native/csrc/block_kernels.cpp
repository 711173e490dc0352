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
// The vector tiles live in block_tile_avx512.cpp, block_tile_avx2.cpp and block_tile_amx.cpp (one instantiation
// per format kind and row count, block_layout.h); the AMX path runs passes of at least `block_amx_min_rows` rows
// (up to 16 a pass) on AMX tiles and the others on the AVX-512 tile (`next_pass`). This file holds the scalar
// reference path, the ops, and the threading: a persistent pool (tile_pool.h) that a call's helpers join when they
// wake, activation quantization split across them (by blocks of 32 columns) when it is large, then whole tiles
// handed out dynamically; a tile's outputs for all M rows are computed by the thread that took it, in one fixed
// order, so neither M nor the thread count nor the hand-out changes a bit.
//
// Stored form (made by assisted_backends/quantized/blocks.py), N padded to tiles of 16 rows:
//   codes  uint8 [T, groups, 256 | 320 | 192 | G·16]  per tile and group, chunks of 4 columns x 16 rows:
//          byte c·64 + l·4 + j holds column 4c + j of row l (bits 8: u = v + 128; bits 4: the low
//          nibble holds q of column 4c + j, the high nibble column 16 + 4c + j, v = q − offset; bits 5
//          (Q5_0, Q5_1, Q5_K): those 256 bytes, then a 64-byte plane of fifth bits, eight little-endian 64-bit masks:
//          bit i of mask c (byte 256 + 8c + i/8, bit i%8) is bit 4 of q in byte i of the nibbles' chunk c,
//          c < 4 the low nibbles of bytes 64c.., c ≥ 4 the high nibbles of bytes 64(c−4)..; v = q − offset;
//          bits 6 (Q6_K, G = 16): groups 2p and 2p + 1 stored together, 384 bytes: their nibbles as the 4-bit layout
//          stores columns 0-15 and 16-31 of a group, then a 128-byte plane of high bits: byte 256 + 64h + i holds
//          in bits 2c, 2c + 1 bits 4-5 of q in byte i of chunk c, h = 0 the low nibbles, h = 1 the high ones)
//   d      fp16 [T, supers, 16]   scale of a super-block of `sb` groups       S = d · sc  (sc if given)
//   dmin   fp16 [T, supers, 16]   optional                                    Z = dmin · mn (mn if given)
//   sc, mn int8 [T, groups, 16]   optional per-group multipliers (K-quants)
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "block_layout.h"
#include "cpu_features.h"
#include "row_math.h"
#include "tile_pool.h"

namespace {

using namespace ab_blocks;

// Bytes ahead in the code stream: 3072 measured best on a Zen 4 EPYC (benchmarks/block_kernels.py --prefetch;
// 0-12288 within ~10 % there); ASSISTED_BACKENDS_PREFETCH or block_prefetch set another.
int64_t prefetch_from_environment() {
  const char* raw = std::getenv("ASSISTED_BACKENDS_PREFETCH");
  return raw && *raw ? std::max<int64_t>(0, std::atoll(raw)) : 3072;
}
std::atomic<int64_t> g_prefetch{prefetch_from_environment()};
std::atomic<int64_t> g_threads_used{0};  // threads that took tiles in this process's last block_linear call
std::atomic<int64_t> g_bytes_per_thread{65536};  // weight bytes a thread at least (block_min_bytes_per_thread)
// A layer takes a second thread only from this many grains up: below ~640 KB one thread is faster, measured per
// call on cold copies (Zen 4 VM, 2 threads, `benchmarks.thread_grain`: 187 KB 0.87x, 590 KB 0.93x, 885 KB 1.07x,
// 3.5 MB 1.40x one thread's speed; the AMX Xeon: 187 KB slower at 2-16 threads, 1 MB 2.1x faster at 8-16).
constexpr int64_t kGrainsForASecondThread = 10;
// The AMX path's shortest pass on AMX tiles (block_amx_min_rows): 16, a full tile, where AMX paid on the Xeon
// measured (`benchmarks.block_kernels --paths avx512vnni amx`: 0.62-1.04x the AVX-512 tile's speed at 1-8 rows,
// 0.74-1.14x at 16).
std::atomic<int64_t> g_amx_min_rows{16};

using ab_math::half_to_float;  // row_math.h: the one fp16 conversion of both native libraries

inline int32_t group_bsum(const Activations& a, int64_t row, int64_t g, int group) {
  const int32_t* b = a.bsum + row * (a.k / 16);
  return group == 16 ? b[g] : b[2 * g] + b[2 * g + 1];
}

// ---- activation quantization (the scalar form; block_tile_avx2.cpp has the same operations in AVX2) ----------

// A block holding a NaN or an infinity gets d_x = NaN and q_x = 0, so every output of the row is NaN (the dense
// product gives NaN or ±inf there); a block whose 1 / d_x overflows (max |x| below ~3.7e-37) gets q_x = 0.
void quantize_row(const float* x, int64_t k, int8_t* q, float* dx, float* zx, int32_t* bsum, int32_t* s32) {
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
    s32[b] = halves[0] + halves[1];
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

void tile_scalar(const Weights& w, const Activations& a, int64_t t, int64_t m0, int64_t rows, float* y) {
  const int64_t blocks = a.k / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    for (int lane = 0; lane < kTile; ++lane) {
      const int64_t n = t * kTile + lane;
      if (n >= w.n) break;
      float acc = 0.0f;
      const uint8_t* tile = w.codes + t * w.groups * w.group_bytes();
      for (int64_t g = 0; g < w.groups; ++g) {
        const int8_t* xq = a.q + m * a.k + g * w.group;
        int32_t isum = 0;
        for (int col = 0; col < w.group; ++col)
          isum += stored_value(tile, w.bits, w.group, w.offset, g, lane, col) * int32_t(xq[col]);
        const int64_t b = g * w.group / kBlock;
        acc = acc + (scale_of(w, t, g, lane) * a.dx[m * blocks + b]) * float(isum);
        if (w.dmin) acc = acc + zero_of(w, t, g, lane) * a.zx[m * blocks + b];
      }
      y[m * w.n + n] = acc;
    }
  }
}

// ---- dispatch ------------------------------------------------------------------------------------------------

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

// The kind a layout runs as (block_layout.h): a real format's own, else the general kind of its bits and group.
int kind_of(const Weights& w) {
  const bool sc = w.sc, zeros = w.dmin, mn = w.dmin && w.mn;
  const bool sb1 = w.sb == 1;
  if (w.bits == 5) return !zeros ? kQ5_0 : sc ? kQ5_K : kQ5_1;  // weights_of admits only these shapes
  if (w.bits == 6) return kQ6_K;                                 // and this one
  if (w.bits == 4) {
    if (!sc && !zeros && w.offset != 0 && sb1) return kQ4_0;
    if (!sc && zeros && !mn && w.offset == 0 && sb1) return kQ4_1;
    if (sc && zeros && mn && w.offset == 0) return kQ4_K;
    return kG4;
  }
  if (w.group == 16) return sc && !zeros ? k8G16 : kG8_16;
  if (!sc && !zeros && sb1) return kQ8_0;
  if (!sc && zeros && !mn && sb1) return k8Min;
  return kG8;
}

// Fields a general kind reads but the layout lacks, filled with neutral values (multiplier 1, zero 0: the
// same bits as leaving the term out).
void fill_neutral(int kind, Weights& w, int64_t tiles, std::vector<at::Tensor>& keep) {
  const bool general = kind == kG4 || kind == kG8 || kind == kG8_16;
  if (!general) return;
  if (!w.sc) keep.push_back(at::ones({tiles * w.groups * kTile}, at::kChar)), w.sc = keep.back().data_ptr<int8_t>();
  if (!w.dmin) {
    keep.push_back(at::zeros({tiles * w.supers * kTile}, at::kHalf));
    w.dmin = reinterpret_cast<const uint16_t*>(keep.back().data_ptr<at::Half>());
    w.mn = nullptr;
  }
  if (!w.mn) keep.push_back(at::ones({tiles * w.groups * kTile}, at::kChar)), w.mn = keep.back().data_ptr<int8_t>();
}

// The next pass over a tile's activation rows: its tile (nullptr: the scalar path) and how many of the `remaining`
// rows it takes. The AMX path takes up to 16 on AMX tiles where at least `block_amx_min_rows` remain, else the
// AVX-512 tile's 8; the AMX model hands off the same way, so the suite tests the real path's hand-off too.
struct Pass {
  TileFn tile;
  int rows;
};

Pass next_pass(int64_t isa, int kind, int64_t remaining) {
  const bool amx = isa == ab_cpu::kAmxPath || isa == ab_cpu::kAmxModelPath;
  if (amx) {
    const int rows = int(std::min<int64_t>(kAmxRowsPerPass, remaining));
    if (rows >= g_amx_min_rows.load(std::memory_order_relaxed))
      return {isa == ab_cpu::kAmxPath ? pick_amx(kind, rows) : pick_amx_model(kind, rows), rows};
  }
  const int rows = int(std::min<int64_t>(kRowsPerPass, remaining));
  if (isa == ab_cpu::kScalarPath) return {nullptr, rows};
  if (amx || isa == ab_cpu::kAvx512VnniPath) return {pick_avx512(kind, rows), rows};
  if (isa == ab_cpu::kAvxVnniPath) return {pick_avxvnni(kind, rows), rows};
  return {pick_avx2(kind, rows), rows};
}

// Reused activation buffers (one set per calling thread; grown, never shrunk).
struct Buffers {
  std::vector<int8_t> q;
  std::vector<float> dx, zx;
  std::vector<int32_t> bsum, s32;
  Activations fit(int64_t m, int64_t k) {
    if (int64_t(q.size()) < m * k) q.resize(m * k);
    if (int64_t(dx.size()) < m * k / kBlock) dx.resize(m * k / kBlock), zx.resize(m * k / kBlock), s32.resize(m * k / kBlock);
    if (int64_t(bsum.size()) < m * k / 16) bsum.resize(m * k / 16);
    return Activations{q.data(), dx.data(), zx.data(), bsum.data(), s32.data(), m, k};
  }
};

void quantize_range(const float* x, int64_t k, int64_t begin, int64_t end, const Activations& a, bool vector) {
  if (begin >= end) return;
  int8_t* q = const_cast<int8_t*>(a.q);
  float *dx = const_cast<float*>(a.dx), *zx = const_cast<float*>(a.zx);
  int32_t *bsum = const_cast<int32_t*>(a.bsum), *s32 = const_cast<int32_t*>(a.s32);
  if (vector) return quantize_blocks_avx2(x, k, begin, end, q, dx, zx, bsum, s32);
  const int64_t blocks = k / kBlock;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t row = i / blocks, b = i % blocks;
    quantize_row(x + row * k + b * kBlock, kBlock, q + row * k + b * kBlock, dx + i, zx + i, bsum + 2 * i, s32 + i);
  }
}

// y [M, N] = the formula over x [M, K] (fp32, contiguous), on the caller and the pool's helpers (tile_pool.h):
// activation quantization first (by the caller alone when small; else handed out in chunks of blocks to every
// participant, and no tile starts before all are done), then whole tiles handed out dynamically.
void run(const Weights& w, int64_t isa, const float* x, int64_t m, float* y) {
  thread_local Buffers buffers;
  const Activations a = buffers.fit(m, w.k);
  const int64_t tiles = (w.n + kTile - 1) / kTile, units = m * (w.k / kBlock);
  const bool vector = isa != ab_cpu::kScalarPath;
  const int kind = kind_of(w);
  // A thread for every grain (64 KB) of weights at most, and one alone below kGrainsForASecondThread grains: a
  // small layer is not worth the helpers' hand-offs.
  const int64_t bytes = tiles * w.groups * w.group_bytes() * (1 + (m - 1) / kRowsPerPass);
  const int64_t per_thread = std::max<int64_t>(1, g_bytes_per_thread.load(std::memory_order_relaxed));
  const bool alone = at::in_parallel_region() || bytes < kGrainsForASecondThread * per_thread;
  int64_t threads = alone ? 1 : at::get_num_threads();
  threads = std::max<int64_t>(1, std::min<int64_t>({threads, tiles, bytes / per_thread}));
  const int64_t chunk = std::max<int64_t>(1, tiles / (16 * threads));  // tiles a grab
  constexpr int64_t kUnitsAlone = 1024, kUnitChunk = 128;  // activation blocks: the caller's alone below this
  const bool split = threads > 1 && units >= kUnitsAlone;
  std::atomic<int64_t> next{0}, used{0}, unit_next{0}, units_done{0};
  std::atomic<bool> ready{false};
  const std::thread::id caller = std::this_thread::get_id();
  auto job = [&]() {
    if (split) {
      for (int64_t u; (u = unit_next.fetch_add(kUnitChunk)) < units;) {
        const int64_t end = std::min(units, u + kUnitChunk);
        quantize_range(x, w.k, u, end, a, vector);
        units_done.fetch_add(end - u, std::memory_order_release);
      }
      ab_pool::wait_until([&] { return units_done.load(std::memory_order_acquire) >= units; });
    } else if (std::this_thread::get_id() == caller) {
      quantize_range(x, w.k, 0, units, a, vector);
      ready.store(true, std::memory_order_release);
    } else {
      ab_pool::wait_until([&] { return ready.load(std::memory_order_acquire); });
    }
    int64_t taken = 0;
    for (int64_t begin; (begin = next.fetch_add(chunk, std::memory_order_relaxed)) < tiles;) {
      const int64_t end = std::min(tiles, begin + chunk);
      taken += end - begin;
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t m0 = 0; m0 < m;) {
          const Pass pass = next_pass(isa, kind, m - m0);
          if (pass.tile) {
            pass.tile(w, a, t, m0, y);
          } else {
            tile_scalar(w, a, t, m0, pass.rows, y);
          }
          m0 += pass.rows;
        }
      }
    }
    if (taken) used.fetch_add(1, std::memory_order_relaxed);
  };
  ab_pool::Pool::get().run(threads - 1, job);
  g_threads_used.store(used.load(), std::memory_order_relaxed);
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
  at::Tensor s32 = at::empty({m, k / kBlock}, at::kInt);
  const Activations a{q.data_ptr<int8_t>(), dx.data_ptr<float>(), zx.data_ptr<float>(), bsum.data_ptr<int32_t>(),
                      s32.data_ptr<int32_t>(), m, k};
  quantize_range(xf.data_ptr<float>(), k, 0, m * (k / kBlock), a, best_isa() != ab_cpu::kScalarPath);
  return {q, dx, zx, bsum};
}

Weights weights_of(const at::Tensor& codes, const at::Tensor& d, const c10::optional<at::Tensor>& dmin,
                   const c10::optional<at::Tensor>& sc, const c10::optional<at::Tensor>& mn, int64_t n, int64_t k,
                   int64_t bits, int64_t group, int64_t sb, int64_t offset) {
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "block kernels: bits must be 4, 5, 6 or 8");
  const bool has_dmin = dmin.has_value() && dmin->defined(), has_sc = sc.has_value() && sc->defined();
  const bool has_mn = mn.has_value() && mn->defined();
  const bool q5_0 = sb == 1 && !has_dmin && !has_sc && !has_mn, q5_1 = sb == 1 && has_dmin && !has_sc && !has_mn;
  const bool q5_k = has_dmin && has_sc && has_mn;
  TORCH_CHECK(bits != 5 || (group == 32 && (q5_0 || ((q5_1 || q5_k) && offset == 0))),
              "block kernels: 5-bit codes take the shapes of Q5_0, Q5_1 or Q5_K only (group 32; sb 1 without sc "
              "or mn, with dmin for Q5_1; or sc, dmin and mn; offset 0 with zeros); store others in 8 bits");
  TORCH_CHECK(bits != 6 || (group == 16 && sb % 2 == 0 && has_sc && !has_dmin && !has_mn),
              "block kernels: 6-bit codes take Q6_K's shape only (group 16, an even sb, sc, no dmin or mn); "
              "store others in 8 bits");
  TORCH_CHECK(group == 32 || (group == 16 && (bits == 8 || bits == 6)),
              "block kernels: group must be 32 (or 16 with 6 or 8 bits)");
  TORCH_CHECK(bits != 8 || offset == 0, "block kernels: an 8-bit weight stores v + 128, offset must be 0");
  TORCH_CHECK(k % kBlock == 0 && k % (group * sb) == 0, "block kernels: K must be a multiple of 32 and of the super-block");
  const int64_t tiles = (n + kTile - 1) / kTile, groups = k / group, supers = groups / sb;
  const int64_t group_bytes = group_bytes_of(int(bits), int(group));
  TORCH_CHECK(codes.is_contiguous() && codes.scalar_type() == at::kByte && codes.numel() == tiles * groups * group_bytes,
              "block kernels: codes has the wrong size or type");
  TORCH_CHECK(d.is_contiguous() && d.scalar_type() == at::kHalf && d.numel() == tiles * supers * kTile,
              "block kernels: d has the wrong size or type");
  Weights w{};
  w.prefetch = g_prefetch.load(std::memory_order_relaxed);
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
  Weights w = weights_of(codes, d, dmin, sc, mn, n, k, bits, group, sb, offset);
  const int64_t chosen = checked_isa(isa);
  const at::Tensor rows = x.reshape({-1, k}).to(at::kFloat).contiguous();
  const int64_t m = rows.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor y = at::empty({m, n}, at::kFloat);
  if (m > 0) {
    std::vector<at::Tensor> neutral;
    if (chosen != ab_cpu::kScalarPath) fill_neutral(kind_of(w), w, (n + kTile - 1) / kTile, neutral);
    run(w, chosen, rows.data_ptr<float>(), m, y.data_ptr<float>());
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
int64_t threads_used() { return g_threads_used.load(); }
int64_t min_bytes_per_thread(int64_t bytes) {
  if (bytes >= 0) g_bytes_per_thread.store(bytes);
  return g_bytes_per_thread.load();
}
int64_t amx_min_rows(int64_t rows) {
  if (rows >= 1) g_amx_min_rows.store(rows);
  return g_amx_min_rows.load();
}
int64_t prefetch(int64_t bytes) {
  if (bytes >= 0) g_prefetch.store(bytes);
  return g_prefetch.load();
}

}  // namespace

TORCH_LIBRARY(assisted_backends, m) {
  m.def("block_linear(Tensor x, Tensor codes, Tensor d, Tensor? dmin, Tensor? sc, Tensor? mn, Tensor? bias, int n, "
        "int k, int bits, int group, int sb, int offset, int isa) -> Tensor");
  m.def("block_quantize_activations(Tensor x) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("block_cpu_isa() -> int", &cpu_isa);
  m.def("block_cpu_features() -> int", &cpu_features);
  m.def("block_cpu_paths(int features) -> int", &cpu_paths);
  m.def("block_threads_used() -> int", &threads_used);
  m.def("block_prefetch(int bytes) -> int", &prefetch);
  m.def("block_min_bytes_per_thread(int bytes) -> int", &min_bytes_per_thread);
  m.def("block_amx_min_rows(int rows) -> int", &amx_min_rows);
}

TORCH_LIBRARY_IMPL(assisted_backends, CPU, m) {
  m.impl("block_linear", &block_linear);
  m.impl("block_quantize_activations", &quantize_activations);
}
