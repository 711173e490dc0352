// The block kernels' shared definitions: the stored weights, the quantized activations, the format kinds the
// tiles are specialised for, and the per-instruction-set entry points (block_tile_avx512.cpp,
// block_tile_avx2.cpp). Plain C++ only: the instruction-set files must not compile torch's inline functions
// under their target flags (the linker could keep that copy for every caller).
#pragma once

#include <cstdint>

namespace ab_blocks {

constexpr int kTile = 16;   // output rows per tile
constexpr int kBlock = 32;  // activation quantization block
constexpr int kRowsPerPass = 8;       // the vector tiles' rows a pass (their accumulators stay in registers)
constexpr int kAmxRowsPerPass = 16;   // the AMX tile's: one activation tile holds 16 rows

// Bytes a group's codes take: bits 4, 256 bytes of nibbles; bits 5, the same 256 and a 64-byte plane of fifth bits;
// bits 6 (16-column groups stored in pairs, 384 bytes a pair): 192; bits 8, G · 16.
inline int64_t group_bytes_of(int bits, int group) {
  return bits == 4 ? 256 : bits == 5 ? 320 : bits == 6 ? 192 : int64_t(group) * kTile;
}

// v of column `col` (< group) of group g, row `lane`, for a tile whose codes start at `tile` (the byte order in
// block_kernels.cpp's header): the scalar path's and the native decoder's one reader of the stored codes.
inline int stored_value(const uint8_t* tile, int bits, int group, int offset, int64_t g, int lane, int col) {
  if (bits == 8) return int(tile[g * group * kTile + (col / 4) * 64 + lane * 4 + col % 4]) - 128;
  int64_t unit = g;
  if (bits == 6) {  // a pair of 16-column groups is stored as one 32-column group of nibbles and its plane
    col += int(g & 1) * 16;
    unit = g & ~int64_t(1);
  }
  const uint8_t* u = tile + unit * group_bytes_of(bits, group);
  const int high = col >= 16, c = col % 16, i = lane * 4 + c % 4;  // i: the byte within its 64-byte chunk
  const uint8_t byte = u[(c / 4) * 64 + i];
  int q = high ? byte >> 4 : byte & 0x0F;
  if (bits == 5) q |= ((u[256 + (high * 4 + c / 4) * 8 + i / 8] >> (i % 8)) & 1) << 4;
  if (bits == 6) q |= ((u[256 + high * 64 + i] >> (2 * (c / 4))) & 3) << 4;
  return q - offset;
}

struct Weights {
  const uint8_t* codes;
  const uint16_t* d;
  const uint16_t* dmin;  // nullptr: no zeros
  const int8_t* sc;      // nullptr: S = d
  const int8_t* mn;      // nullptr: Z = dmin
  int64_t n, k, groups, supers;
  int bits, group, sb, offset;
  int64_t prefetch;  // bytes ahead in the code stream
  int64_t group_bytes() const { return group_bytes_of(bits, group); }
};

struct Activations {
  const int8_t* q;      // [M, K]
  const float* dx;      // [M, K/32]
  const float* zx;      // [M, K/32]
  const int32_t* bsum;  // [M, K/16] sums of q over 16 columns
  const int32_t* s32;   // [M, K/32] sums of q over 32 columns
  int64_t m, k;
};

// Where each of the ROWS activation rows from m0 starts: its codes, its blocks' d_x and z_x, and its sums of q_x
// per group (over 16 columns for 16-column groups, else over 32).
template <int ROWS>
struct RowsAt {
  const int8_t* xq[ROWS];
  const float* dx[ROWS];
  const float* zx[ROWS];
  const int32_t* sums[ROWS];
  RowsAt(const Activations& a, int64_t m0, bool sums_of_16) {
    const int64_t blocks = a.k / kBlock;
    for (int r = 0; r < ROWS; ++r) {
      xq[r] = a.q + (m0 + r) * a.k;
      dx[r] = a.dx + (m0 + r) * blocks;
      zx[r] = a.zx + (m0 + r) * blocks;
      sums[r] = sums_of_16 ? a.bsum + (m0 + r) * (a.k / 16) : a.s32 + (m0 + r) * blocks;
    }
  }
};

// Where tile t's streams start for a kind K (below): its codes, the super-blocks' d and dmin, the groups' sc and mn
// (nullptr where K has none), the loop bounds (a kind whose super-blocks are single groups loops over the groups),
// and the correction times Σ q_x that v = u − 128 (8 bits) or q − offset asks for.
template <class K>
struct TileStreams {
  int64_t groups, supers, sb;
  const uint8_t* codes;
  const uint16_t *d, *dmin;
  const int8_t *sc, *mn;
  int32_t correction;
  TileStreams(const Weights& w, int64_t t)
      : groups(w.groups),
        supers(K::SB1 ? w.groups : w.supers),
        sb(K::SB1 ? 1 : w.sb),
        codes(w.codes + t * w.groups * K::GROUP_BYTES),
        d(w.d + t * supers * kTile),
        dmin(K::MIN ? w.dmin + t * supers * kTile : nullptr),
        sc(K::SC ? w.sc + t * w.groups * kTile : nullptr),
        mn(K::MN ? w.mn + t * w.groups * kTile : nullptr),
        correction(K::BITS == 8 ? 128 : w.offset) {}
};

// A format's shape as the tile sees it at compile time (no branch on the format inside the loop):
// BITS stored (4; 5: nibbles and a plane of fifth bits; 6: pairs of 16-column groups as nibbles and a plane of
// two high bits; 8), 16-column groups, per-group multiplier sc, zeros
// (dmin), per-group zero multiplier mn, and for 4- and 5-bit codes whether v = q − offset needs the offset
// correction (a runtime value, e.g. 8 for Q4_0, 16 for Q5_0, 32 for Q6_K), and whether every super-block is one group
// (sb = 1: one loop over the groups, the scale read with its group).
template <int BITS_, bool G16_, bool SC_, bool MIN_, bool MN_, bool OFF_, bool SB1_ = false>
struct Kind {
  static constexpr int BITS = BITS_;
  static constexpr bool G16 = G16_, SC = SC_, MIN = MIN_, MN = MN_, OFF = OFF_, SB1 = SB1_;
  static constexpr int G = G16_ ? 16 : 32;
  static constexpr int64_t GROUP_BYTES = BITS_ == 4 ? 256 : BITS_ == 5 ? 320 : BITS_ == 6 ? 192 : G * kTile;
};

// The kinds, by index (kind_of in block_kernels.cpp picks one). A kind named after a format is that format's
// layout; the other 8-bit kinds hold the 5- and 6-bit formats widened (`blocks.widened`, what their planes are
// checked against) and layouts no file makes, which run on the general kind of their bits and group with absent
// fields filled by neutral ones (multiplier 1, zero 0).
using KQ4_0 = Kind<4, false, false, false, false, true, true>;
using KQ4_1 = Kind<4, false, false, true, false, false, true>;
using KQ4_K = Kind<4, false, true, true, true, false>;
using KG4 = Kind<4, false, true, true, true, true>;
using KQ5_0 = Kind<5, false, false, false, false, true, true>;
using KQ5_1 = Kind<5, false, false, true, false, false, true>;
using KQ5_K = Kind<5, false, true, true, true, false>;
using KQ6_K = Kind<6, true, true, false, false, true>;             // its own tile (pair_tile)
using KQ8_0 = Kind<8, false, false, false, false, false, true>;    // Q8_0, and Q5_0 widened
using K8Min = Kind<8, false, false, true, false, false, true>;      // Q5_1 widened
using KG8 = Kind<8, false, true, true, true, false>;               // Q5_K widened, and the general 8-bit kind
using K8G16 = Kind<8, true, true, false, false, false>;            // Q6_K widened
using KG8_16 = Kind<8, true, true, true, true, false>;
enum KindIndex : int { kQ4_0, kQ4_1, kQ4_K, kG4, kQ5_0, kQ5_1, kQ5_K, kQ6_K, kQ8_0, k8Min, kG8, k8G16, kG8_16 };

using TileFn = void (*)(const Weights&, const Activations&, int64_t t, int64_t m0, float* y);

TileFn pick_avx512(int kind, int rows);
TileFn pick_avxvnni(int kind, int rows);
TileFn pick_avx2(int kind, int rows);
TileFn pick_amx(int kind, int rows);        // rows 1..16, the AMX int8 instructions
TileFn pick_amx_model(int kind, int rows);  // the same code on a software model of them (tests)

// Quantize blocks [begin, end) of the flattened [M, K/32] block grid (AVX2; the same bits as the scalar form).
void quantize_blocks_avx2(const float* x, int64_t k, int64_t begin, int64_t end, int8_t* q, float* dx, float* zx,
                          int32_t* bsum, int32_t* s32);

#define AB_ROW_TABLE(KIND, FN)                                \
  switch (rows) {                                             \
    case 1: return FN<KIND, 1>;                               \
    case 2: return FN<KIND, 2>;                               \
    case 3: return FN<KIND, 3>;                               \
    case 4: return FN<KIND, 4>;                               \
    case 5: return FN<KIND, 5>;                               \
    case 6: return FN<KIND, 6>;                               \
    case 7: return FN<KIND, 7>;                               \
    default: return FN<KIND, 8>;                              \
  }

// Rows 9-16 for the AMX tile (at most 16 rows a pass), then AB_ROW_TABLE's 1-8.
#define AB_ROW_TABLE16(KIND, FN)                              \
  switch (rows) {                                             \
    case 9: return FN<KIND, 9>;                               \
    case 10: return FN<KIND, 10>;                             \
    case 11: return FN<KIND, 11>;                             \
    case 12: return FN<KIND, 12>;                             \
    case 13: return FN<KIND, 13>;                             \
    case 14: return FN<KIND, 14>;                             \
    case 15: return FN<KIND, 15>;                             \
    case 16: return FN<KIND, 16>;                             \
    default: break;                                           \
  }                                                           \
  AB_ROW_TABLE(KIND, FN)

#define AB_KIND_TABLE(FN, PAIR_FN) AB_KIND_TABLE_OF(AB_ROW_TABLE, FN, PAIR_FN)

#define AB_KIND_TABLE_OF(ROW_TABLE, FN, PAIR_FN)              \
  switch (kind) {                                             \
    case kQ4_0: ROW_TABLE(KQ4_0, FN)                          \
    case kQ4_1: ROW_TABLE(KQ4_1, FN)                          \
    case kQ4_K: ROW_TABLE(KQ4_K, FN)                          \
    case kG4: ROW_TABLE(KG4, FN)                              \
    case kQ5_0: ROW_TABLE(KQ5_0, FN)                          \
    case kQ5_1: ROW_TABLE(KQ5_1, FN)                          \
    case kQ5_K: ROW_TABLE(KQ5_K, FN)                          \
    case kQ6_K: ROW_TABLE(KQ6_K, PAIR_FN)                     \
    case kQ8_0: ROW_TABLE(KQ8_0, FN)                          \
    case k8Min: ROW_TABLE(K8Min, FN)                          \
    case kG8: ROW_TABLE(KG8, FN)                              \
    case k8G16: ROW_TABLE(K8G16, FN)                          \
    default: ROW_TABLE(KG8_16, FN)                            \
  }

}  // namespace ab_blocks
