// The fp32 arithmetic the package's two native libraries share, in one place: the kernels' library (block_kernels.cpp,
// chunk_attention.h) and the native decoder (decoder/decoder.cpp) include this header, and both build keys hash it
// (native/extension.py HEADERS, native/decoder_build.py), so the two cannot drift apart.
//
//   half_to_float(h)   fp16 -> fp32, exact (every fp16 value is an fp32 value)
//   exp(x)             x = n ln2 + r (ln2 in two parts), |r| ≤ ln2 / 2, e^r by a degree-6 polynomial (Horner),
//                      times 2^n by adding n to the exponent bits; 0 below −87, x taken as 88 above 88 (and NaN);
//                      separate multiplies and adds (the files are built with -ffp-contract=off: no FMA)
//   tree8(a)           ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): how 8 lanes become one sum
//   dot(q, k)          lane i sums q_j k_j for j ≡ i (mod 8), j ascending; then tree8
//                      (an attention row in chunks of its keys: chunk_attention.h)
// The AVX2 bodies compute the same operations in the same order as the scalar ones (a vector of 8 is the 8 lanes),
// so a row's bits do not depend on the path, nor on how many rows share a call.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace ab_math {

#define AB_MATH_AVX2 __attribute__((target("avx2,fma")))

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

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpLow = -87.0f;   // exp below this is 0
constexpr float kExpHigh = 88.0f;   // x above this (or NaN) is taken as this

// exp(x). Below −87 the value is 0 (e^−87 ≈ 1.6e-38 is near the smallest normal float). Where the native decoder
// adds it to 1 (SiLU's 1 + e^−g, GELU-tanh's e^2y + 1) that is the same float either way: 1 + 1.6e-38 rounds to 1.
inline float exp_scalar(float x) {
  if (x < kExpLow) return 0.0f;
  x = std::min(kExpHigh, x);  // NaN: kExpHigh, as the vector body's _mm256_min_ps(x, 88)
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

AB_MATH_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLow), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(kExpHigh));  // the second operand where x is NaN
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

inline float tree8(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

AB_MATH_AVX2 inline float tree8_avx(__m256 v) {  // tree8: (a_i + a_{i+4}), then pairs (0, 2) and (1, 3)
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

inline float dot_scalar(const float* q, const float* k, int64_t d) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < d; ++i) lanes[i % 8] = lanes[i % 8] + q[i] * k[i];
  return tree8(lanes);
}

AB_MATH_AVX2 inline float dot_avx2(const float* q, const float* k, int64_t d) {  // d % 8 == 0
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i)));
  return tree8_avx(acc);
}

}  // namespace ab_math
