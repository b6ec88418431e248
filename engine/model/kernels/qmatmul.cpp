// Matrix products that read GGUF-quantized weights in place (engine/model/quant.py packs them).
//
// A packed weight [N, K] holds, per row, one small integer code c per element and, per block of
// BLOCK elements (16 or 32), an fp32 scale and min:  w = scale * float(c) + min.  Signed formats
// (Q8_0, Q4_0, Q5_0, Q3_K, Q6_K) store c = q - offset in two's complement and have no min;
// unsigned ones (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) store q and a min per block. Codes of 4 bits are
// stored two to a byte: in each run of 64 elements, byte j holds element j in its low nibble and
// element 32 + j in its high one; wider codes take a byte each. Rows are padded to whole runs.
//
// Two products, both reading the codes directly:
//  - qlinear (fp32 activations, any row count): per block, the codes as floats are multiplied
//    into x and summed, then scaled; the mins multiply per-block sums of x:
//        y = sum_b scale_b * sum_{k in b} c_k x_k  +  sum_b min_b * sum_{k in b} x_k.
//    Each output is an fp32 evaluation of the exact dot product of x with scale * c + min.
//  - qlinear_bf16 (bf16 activations, AVX512-BF16 only): each weight row is dequantized once
//    (scale * c + min in fp32, rounded to bf16, as a dense bf16 copy of the dequantized checkpoint
//    would hold it) and multiplied into up to 4 activation rows at a time with bf16 dot products.
// In both, a row's result depends on its own values only, never on how many rows the call has or
// where the row sits (the deterministic lane relies on it); it does depend on the instruction
// set, which the caller chooses and the fingerprint records. Instruction sets are picked from what
// the CPU reports at run time, with a portable scalar path for every other CPU.
//
// qdequantize writes the weights out as fp32, multiplying then adding (two roundings; this file is
// built with -ffp-contract=off), which is how the gguf package dequantizes: bit for bit its values.
//
// Threads: the caller says how many; torch's own pool (at::parallel_for) takes chunks of weight
// rows from a shared counter, so a thread that loses its core to another process holds up only
// the chunk it has.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TG_X86 1
#endif

namespace {

enum Isa : int64_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

int64_t detected_isa() {
#ifdef TG_X86
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return kAvx512Bf16;
  if (avx512) return kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kAvx2;
#endif
  return kScalar;
}

struct Packed {
  const uint8_t* codes;
  const float* scales;
  const float* mins;
  int64_t rows, cols, padded_cols;  // K and K rounded up to 64
  int64_t bits, block;
  bool is_signed;

  int64_t row_bytes() const { return bits == 4 ? padded_cols / 2 : padded_cols; }
  int64_t row_blocks() const { return padded_cols / block; }
  const uint8_t* row_codes(int64_t n) const { return codes + n * row_bytes(); }
  const float* row_scales(int64_t n) const { return scales + n * row_blocks(); }
  const float* row_mins(int64_t n) const { return mins + n * row_blocks(); }
};

// -- scalar: any CPU ------------------------------------------------------------------------

inline int32_t code_at(const Packed& w, const uint8_t* q, int64_t k) {
  int32_t c;
  if (w.bits == 4) {
    uint8_t byte = q[(k / 64) * 32 + (k % 32)];
    c = (k % 64) < 32 ? (byte & 0x0F) : (byte >> 4);
    if (w.is_signed) c = (c ^ 8) - 8;
  } else {
    c = w.is_signed ? static_cast<int32_t>(static_cast<int8_t>(q[k])) : q[k];
  }
  return c;
}

void dequantize_row_scalar(const Packed& w, int64_t n, float* out) {
  const uint8_t* q = w.row_codes(n);
  const float* sc = w.row_scales(n);
  const float* mn = w.row_mins(n);
  for (int64_t k = 0; k < w.cols; ++k) {
    float scaled = sc[k / w.block] * static_cast<float>(code_at(w, q, k));
    out[k] = scaled + mn[k / w.block];
  }
}

// Sums of x over each block, for the mins (unsigned formats only).
void block_sums(const float* x, int64_t m, int64_t cols, int64_t block, float* out) {
  int64_t blocks = cols / block;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      float s = 0.0f;
      for (int64_t k = 0; k < block; ++k) s += x[r * cols + b * block + k];
      out[r * blocks + b] = s;
    }
}

// sum_b mins_b * xsum_b in a fixed order.
inline float min_term(const float* mn, const float* xsum, int64_t blocks) {
  float s = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) s += mn[b] * xsum[b];
  return s;
}

void dot_rows_scalar(const Packed& w, int64_t n, const float* x, const float* xsum, int64_t m, float* y,
                     int64_t ldy) {
  const uint8_t* q = w.row_codes(n);
  const float* sc = w.row_scales(n);
  const int64_t blocks = w.cols / w.block;
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * w.cols;
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      float partial = 0.0f;
      for (int64_t k = b * w.block; k < (b + 1) * w.block; ++k) partial += static_cast<float>(code_at(w, q, k)) * xr[k];
      acc += sc[b] * partial;
    }
    if (!w.is_signed) acc += min_term(w.row_mins(n), xsum + r * blocks, blocks);
    y[r * ldy] = acc;
  }
}

#ifdef TG_X86

// -- AVX-512 -----------------------------------------------------------------------------------

#define TG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

// The codes of run c (64 elements) as four vectors of 16 floats.
template <int BITS, bool SIGNED>
TG_AVX512 inline void codes_avx512(const uint8_t* q, int64_t c, __m512 f[4]) {
  __m128i b[4];
  if (BITS == 4) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c * 32));
    __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i lo = _mm256_and_si256(v, mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    if (SIGNED) {  // sign-extend the nibbles: (c ^ 8) - 8
      __m256i eight = _mm256_set1_epi8(8);
      lo = _mm256_sub_epi8(_mm256_xor_si256(lo, eight), eight);
      hi = _mm256_sub_epi8(_mm256_xor_si256(hi, eight), eight);
    }
    b[0] = _mm256_castsi256_si128(lo);
    b[1] = _mm256_extracti128_si256(lo, 1);
    b[2] = _mm256_castsi256_si128(hi);
    b[3] = _mm256_extracti128_si256(hi, 1);
  } else {
    for (int i = 0; i < 4; ++i) b[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c * 64 + 16 * i));
  }
  for (int i = 0; i < 4; ++i)
    f[i] = _mm512_cvtepi32_ps(SIGNED ? _mm512_cvtepi8_epi32(b[i]) : _mm512_cvtepu8_epi32(b[i]));
}

// Groups [0, groups) of run c (16 elements each) into each row's accumulators.
template <int BITS, int BLOCK, bool SIGNED, int R, int groups>
TG_AVX512 inline void run_avx512(const uint8_t* q, const float* sc, int64_t c, const float* x, int64_t K,
                                 __m512 acc[R][2]) {
  __m512 f[4];
  codes_avx512<BITS, SIGNED>(q, c, f);
  if (BLOCK == 32) {
    for (int h = 0; h < groups / 2; ++h) {
      __m512 scale = _mm512_set1_ps(sc[2 * c + h]);
      for (int r = 0; r < R; ++r) {
        const float* xr = x + r * K + c * 64 + 32 * h;
        __m512 p = _mm512_mul_ps(f[2 * h], _mm512_loadu_ps(xr));
        p = _mm512_fmadd_ps(f[2 * h + 1], _mm512_loadu_ps(xr + 16), p);
        acc[r][h] = _mm512_fmadd_ps(scale, p, acc[r][h]);
      }
    }
  } else {
    for (int i = 0; i < groups; ++i) {
      __m512 scale = _mm512_set1_ps(sc[4 * c + i]);
      for (int r = 0; r < R; ++r) {
        __m512 p = _mm512_mul_ps(f[i], _mm512_loadu_ps(x + r * K + c * 64 + 16 * i));
        acc[r][i % 2] = _mm512_fmadd_ps(scale, p, acc[r][i % 2]);
      }
    }
  }
}

TG_AVX512 inline float min_term_avx512(const float* mn, const float* xsum, int64_t blocks) {
  __m512 acc = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 16 <= blocks; b += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(mn + b), _mm512_loadu_ps(xsum + b), acc);
  if (b < blocks) {
    __mmask16 tail = static_cast<__mmask16>((1u << (blocks - b)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, mn + b), _mm512_maskz_loadu_ps(tail, xsum + b), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <int BITS, int BLOCK, bool SIGNED, int R>
TG_AVX512 void dot_avx512(const Packed& w, int64_t n, const float* x, const float* xsum, float* y, int64_t ldy) {
  const int64_t K = w.cols, runs = K / 64, blocks = K / BLOCK;
  const uint8_t* q = w.row_codes(n);
  const float* sc = w.row_scales(n);
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < runs; ++c) run_avx512<BITS, BLOCK, SIGNED, R, 4>(q, sc, c, x, K, acc);
  if (K % 64) run_avx512<BITS, BLOCK, SIGNED, R, 2>(q, sc, runs, x, K, acc);  // K is a multiple of 32
  for (int r = 0; r < R; ++r) {
    float total = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
    if (!SIGNED) total += min_term_avx512(w.row_mins(n), xsum + r * blocks, blocks);
    y[r * ldy] = total;
  }
}

// One row dequantized: scale * c + min, two roundings.
template <int BITS, int BLOCK, bool SIGNED>
TG_AVX512 void dequantize_row_avx512(const Packed& w, int64_t n, float* out) {
  const uint8_t* q = w.row_codes(n);
  const float* sc = w.row_scales(n);
  const float* mn = w.row_mins(n);
  __m512 f[4];
  for (int64_t start = 0; start < w.cols; start += 64) {
    int64_t c = start / 64;
    codes_avx512<BITS, SIGNED>(q, c, f);
    int groups = w.cols - start >= 64 ? 4 : 2;
    for (int i = 0; i < groups; ++i) {
      int64_t b = (c * 64 + 16 * i) / BLOCK;
      __m512 v = _mm512_add_ps(_mm512_mul_ps(f[i], _mm512_set1_ps(sc[b])), _mm512_set1_ps(mn[b]));
      _mm512_storeu_ps(out + start + 16 * i, v);
    }
  }
}

// -- AVX-512 BF16: bf16 activations ------------------------------------------------------------

#define TG_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

// One row dequantized as above, then rounded to bf16 (nearest even); scratch holds the fp32 row.
template <int BITS, int BLOCK, bool SIGNED>
TG_BF16 void dequantize_row_bf16(const Packed& w, int64_t n, float* scratch, uint16_t* out) {
  dequantize_row_avx512<BITS, BLOCK, SIGNED>(w, n, scratch);
  for (int64_t k = 0; k < w.cols; k += 32) {
    __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(scratch + k + 16), _mm512_loadu_ps(scratch + k));
    _mm512_storeu_si512(reinterpret_cast<void*>(out + k), (__m512i)pair);
  }
}

// A tile of NW dequantized weight rows (bf16, `ldw` apart) times R activation rows: one accumulator
// per output, summing 32-element steps of k in order, then reduced in a fixed tree. Each output's
// sum is the same sequence of operations whatever NW and R are, so a row's result does not depend
// on the call's row count or the row's place in it.
template <int NW, int R>
TG_BF16 void tile_bf16(const uint16_t* wt, int64_t ldw, const uint16_t* x, int64_t K, float* y, int64_t ldy) {
  __m512 acc[NW][R];
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {  // K is a multiple of 32
    __m512bh wv[NW];
    for (int i = 0; i < NW; ++i) wv[i] = (__m512bh)_mm512_loadu_si512(wt + i * ldw + k);
    for (int r = 0; r < R; ++r) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * K + k);
      for (int i = 0; i < NW; ++i) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], wv[i], xv);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NW; ++i) y[r * ldy + i] = _mm512_reduce_add_ps(acc[i][r]);
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t);
constexpr int kTileW = 4, kTileR = 4;  // weight rows and activation rows per register tile

template <int NW, std::size_t... R>
constexpr std::array<TileFn, kTileR> tiles_for(std::index_sequence<R...>) {
  return {tile_bf16<NW, static_cast<int>(R) + 1>...};
}

template <std::size_t... W>
constexpr std::array<std::array<TileFn, kTileR>, kTileW> all_tiles(std::index_sequence<W...>) {
  return {tiles_for<static_cast<int>(W) + 1>(std::make_index_sequence<kTileR>{})...};
}

// -- AVX2 + FMA --------------------------------------------------------------------------------

#define TG_AVX2 __attribute__((target("avx2,fma")))

// Group i (16 elements) of run c as two vectors of 8 floats.
template <int BITS, bool SIGNED>
TG_AVX2 inline void codes_avx2(const uint8_t* q, int64_t c, int i, __m256 f[2]) {
  __m128i bytes;
  if (BITS == 4) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c * 32 + 16 * (i % 2)));
    __m128i mask = _mm_set1_epi8(0x0F);
    bytes = i < 2 ? _mm_and_si128(v, mask) : _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    if (SIGNED) bytes = _mm_sub_epi8(_mm_xor_si128(bytes, _mm_set1_epi8(8)), _mm_set1_epi8(8));
  } else {
    bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c * 64 + 16 * i));
  }
  __m128i high = _mm_srli_si128(bytes, 8);
  f[0] = _mm256_cvtepi32_ps(SIGNED ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
  f[1] = _mm256_cvtepi32_ps(SIGNED ? _mm256_cvtepi8_epi32(high) : _mm256_cvtepu8_epi32(high));
}

TG_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int BITS, int BLOCK, bool SIGNED, int R>
TG_AVX2 void dot_avx2(const Packed& w, int64_t n, const float* x, const float* xsum, float* y, int64_t ldy) {
  const int64_t K = w.cols, blocks = K / BLOCK;
  const uint8_t* q = w.row_codes(n);
  const float* sc = w.row_scales(n);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  __m256 f[2];
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 partial[R];
    for (int r = 0; r < R; ++r) partial[r] = _mm256_setzero_ps();
    for (int64_t start = b * BLOCK; start < (b + 1) * BLOCK; start += 16) {
      codes_avx2<BITS, SIGNED>(q, start / 64, static_cast<int>((start % 64) / 16), f);
      for (int r = 0; r < R; ++r) {
        partial[r] = _mm256_fmadd_ps(f[0], _mm256_loadu_ps(x + r * K + start), partial[r]);
        partial[r] = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(x + r * K + start + 8), partial[r]);
      }
    }
    __m256 scale = _mm256_set1_ps(sc[b]);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(scale, partial[r], acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float total = hsum_avx2(acc[r]);
    if (!SIGNED) total += min_term(w.row_mins(n), xsum + r * blocks, blocks);
    y[r * ldy] = total;
  }
}

// One row dequantized as dequantize_row_scalar does it (scale * c, then + min: two roundings).
template <int BITS, int BLOCK, bool SIGNED>
TG_AVX2 void dequantize_row_avx2(const Packed& w, int64_t n, float* out) {
  const uint8_t* q = w.row_codes(n);
  const float* sc = w.row_scales(n);
  const float* mn = w.row_mins(n);
  __m256 f[2];
  for (int64_t start = 0; start < w.cols; start += 16) {  // cols is a multiple of 32
    codes_avx2<BITS, SIGNED>(q, start / 64, static_cast<int>((start % 64) / 16), f);
    const int64_t b = start / BLOCK;  // a group of 16 lies in one block
    __m256 scale = _mm256_set1_ps(sc[b]), min = _mm256_set1_ps(mn[b]);
    _mm256_storeu_ps(out + start, _mm256_add_ps(_mm256_mul_ps(f[0], scale), min));
    _mm256_storeu_ps(out + start + 8, _mm256_add_ps(_mm256_mul_ps(f[1], scale), min));
  }
}

// A tile of NW dequantized fp32 weight rows (`ldw` apart) times R fp32 activation rows, as
// tile_bf16 does it: one accumulator per output over 8-element steps of k in order, then a fixed
// reduction, so a row's result does not depend on NW, R, the call's row count or its place.
template <int NW, int R>
TG_AVX2 void tile_f32(const float* wt, int64_t ldw, const float* x, int64_t K, float* y, int64_t ldy) {
  __m256 acc[NW][R];
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {  // K is a multiple of 32
    __m256 wv[NW];
    for (int i = 0; i < NW; ++i) wv[i] = _mm256_loadu_ps(wt + i * ldw + k);
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(x + r * K + k);
      for (int i = 0; i < NW; ++i) acc[i][r] = _mm256_fmadd_ps(wv[i], xv, acc[i][r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NW; ++i) y[r * ldy + i] = hsum_avx2(acc[i][r]);
}

using TileF32Fn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);
constexpr int kTileF32W = 4, kTileF32R = 3;  // 12 accumulators, 4 weight vectors, 1 activation: 16 registers

template <int NW, std::size_t... R>
constexpr std::array<TileF32Fn, kTileF32R> f32_tiles_for(std::index_sequence<R...>) {
  return {tile_f32<NW, static_cast<int>(R) + 1>...};
}

template <std::size_t... W>
constexpr std::array<std::array<TileF32Fn, kTileF32R>, kTileF32W> all_f32_tiles(std::index_sequence<W...>) {
  return {f32_tiles_for<static_cast<int>(W) + 1>(std::make_index_sequence<kTileF32R>{})...};
}

#endif  // TG_X86

// -- dispatch ----------------------------------------------------------------------------------

using DotFn = void (*)(const Packed&, int64_t, const float*, const float*, float*, int64_t);
using RowFn = void (*)(const Packed&, int64_t, float*);
using RowBf16Fn = void (*)(const Packed&, int64_t, float*, uint16_t*);

template <int BITS, int BLOCK, bool SIGNED>
DotFn dot_for(int64_t isa, int rows) {
#ifdef TG_X86
  if (isa >= kAvx512) {
    static const DotFn fns[4] = {dot_avx512<BITS, BLOCK, SIGNED, 1>, dot_avx512<BITS, BLOCK, SIGNED, 2>,
                                 dot_avx512<BITS, BLOCK, SIGNED, 3>, dot_avx512<BITS, BLOCK, SIGNED, 4>};
    return fns[rows - 1];
  }
  if (isa == kAvx2) {
    static const DotFn fns[4] = {dot_avx2<BITS, BLOCK, SIGNED, 1>, dot_avx2<BITS, BLOCK, SIGNED, 2>,
                                 dot_avx2<BITS, BLOCK, SIGNED, 3>, dot_avx2<BITS, BLOCK, SIGNED, 4>};
    return fns[rows - 1];
  }
#endif
  return nullptr;
}

// The kernel for a format: `pick` is handed the format's template arguments.
template <typename Pick>
auto by_format(const Packed& w, const Pick& pick) {
  if (w.bits == 4 && w.block == 32) return w.is_signed ? pick.template get<4, 32, true>() : pick.template get<4, 32, false>();
  if (w.bits == 4) return w.is_signed ? pick.template get<4, 16, true>() : pick.template get<4, 16, false>();
  if (w.block == 32) return w.is_signed ? pick.template get<8, 32, true>() : pick.template get<8, 32, false>();
  return w.is_signed ? pick.template get<8, 16, true>() : pick.template get<8, 16, false>();
}

struct PickDot {
  int64_t isa;
  int rows;
  template <int B, int L, bool S>
  DotFn get() const { return dot_for<B, L, S>(isa, rows); }
};

struct PickRow {
  template <int B, int L, bool S>
  RowFn get() const {
#ifdef TG_X86
    return dequantize_row_avx512<B, L, S>;
#else
    return nullptr;
#endif
  }
};

struct PickRowAvx2 {
  template <int B, int L, bool S>
  RowFn get() const {
#ifdef TG_X86
    return dequantize_row_avx2<B, L, S>;
#else
    return nullptr;
#endif
  }
};

struct PickRowBf16 {
  template <int B, int L, bool S>
  RowBf16Fn get() const {
#ifdef TG_X86
    return dequantize_row_bf16<B, L, S>;
#else
    return nullptr;
#endif
  }
};

Packed packed_of(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins, int64_t cols,
                 int64_t bits, int64_t block, int64_t offset) {
  TORCH_CHECK(codes.dtype() == at::kByte && codes.dim() == 2 && codes.is_contiguous(), "codes: contiguous uint8 [N, bytes]");
  TORCH_CHECK(scales.dtype() == at::kFloat && scales.is_contiguous() && mins.dtype() == at::kFloat && mins.is_contiguous(),
              "scales and mins: contiguous float32");
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  TORCH_CHECK(block == 16 || block == 32, "block must be 16 or 32");
  TORCH_CHECK(cols > 0 && cols % 32 == 0 && cols % block == 0, "cols must be a positive multiple of 32 and of block");
  Packed w{codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), mins.data_ptr<float>(), codes.size(0), cols,
           (cols + 63) / 64 * 64, bits, block, offset != 0};
  TORCH_CHECK(codes.size(1) == w.row_bytes(), "codes: ", w.row_bytes(), " bytes per row expected");
  TORCH_CHECK(scales.numel() == w.rows * w.row_blocks() && mins.numel() == scales.numel(), "scales/mins: one per block");
  return w;
}

// Hands out [0, total) in chunks of `chunk` to `threads` threads of torch's pool, first come first
// served, so a thread that loses its core to another process holds up only the chunk it has (the
// others take the rest). The pool's size is set for the call and put back after: the model runner
// keeps torch's own ops on fewer threads in small steps (docs/engine.md, "Threads").
template <typename F>
void parallel_chunks(int64_t total, int64_t chunk, int64_t threads, const F& body) {
  int64_t chunks = (total + chunk - 1) / chunk;
  threads = std::min<int64_t>(threads, chunks);
  if (threads <= 1 || at::in_parallel_region()) {
    body(0, total);
    return;
  }
  int before = at::get_num_threads();
  if (before != threads) at::set_num_threads(static_cast<int>(threads));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      body(c * chunk, std::min(total, (c + 1) * chunk));
    }
  });
  if (before != threads) at::set_num_threads(before);
}

int64_t clamp_isa(int64_t isa) { return std::min(std::max<int64_t>(isa, kScalar), detected_isa()); }

// y [M, N] = x [M, K] W^T, x float32.
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                   int64_t cols, int64_t bits, int64_t block, int64_t offset, int64_t isa, int64_t chunk_rows,
                   int64_t threads) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.size(1) == cols && x.is_contiguous(),
              "x: contiguous float32 [M, ", cols, "]");
  isa = clamp_isa(isa);
  const int64_t M = x.size(0), N = w.rows, blocks = cols / block;
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  std::vector<float> xsum(w.is_signed ? 0 : M * blocks);
  if (!w.is_signed) block_sums(xp, M, cols, block, xsum.data());
  DotFn tiles[4];
  for (int r = 0; r < 4; ++r) tiles[r] = by_format(w, PickDot{isa, r + 1});
  parallel_chunks(N, std::max<int64_t>(chunk_rows, 1), threads, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t r0 = 0; r0 < M; r0 += 4) {
        int rows = static_cast<int>(std::min<int64_t>(4, M - r0));
        const float* xs = w.is_signed ? nullptr : xsum.data() + r0 * blocks;
        if (tiles[rows - 1] != nullptr) {
          tiles[rows - 1](w, n, xp + r0 * cols, xs, yp + r0 * N + n, N);
        } else {
          dot_rows_scalar(w, n, xp + r0 * cols, xs, rows, yp + r0 * N + n, N);
        }
      }
    }
  });
  return y;
}

// y [M, N] = x [M, K] W^T, x bfloat16, W dequantized row by row to bfloat16 (AVX512-BF16 only).
at::Tensor qlinear_bf16(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                        int64_t cols, int64_t bits, int64_t block, int64_t offset, int64_t chunk_rows,
                        int64_t threads) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  TORCH_CHECK(x.dtype() == at::kBFloat16 && x.dim() == 2 && x.size(1) == cols && x.is_contiguous(),
              "x: contiguous bfloat16 [M, ", cols, "]");
  TORCH_CHECK(detected_isa() >= kAvx512Bf16, "qlinear_bf16 needs AVX512-BF16");
  const int64_t M = x.size(0), N = w.rows;
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
#ifdef TG_X86
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  float* yp = y.data_ptr<float>();
  RowBf16Fn dequantize_row = by_format(w, PickRowBf16{});
  static const auto tiles = all_tiles(std::make_index_sequence<kTileW>{});
  chunk_rows = std::max<int64_t>(chunk_rows, 1);
  // A chunk of weight rows is dequantized once into a small bf16 buffer that stays in cache and
  // multiplied into every activation row, so no call dequantizes the whole weight.
  parallel_chunks(N, chunk_rows, threads, [&](int64_t n0, int64_t n1) {
    std::vector<uint16_t> rows((n1 - n0) * w.padded_cols);
    std::vector<float> scratch(w.padded_cols);
    for (int64_t n = n0; n < n1; ++n) dequantize_row(w, n, scratch.data(), rows.data() + (n - n0) * w.padded_cols);
    for (int64_t r0 = 0; r0 < M; r0 += kTileR) {
      const int64_t r = std::min<int64_t>(kTileR, M - r0);
      for (int64_t i0 = n0; i0 < n1; i0 += kTileW) {
        const int64_t nw = std::min<int64_t>(kTileW, n1 - i0);
        tiles[nw - 1][r - 1](rows.data() + (i0 - n0) * w.padded_cols, w.padded_cols, xp + r0 * cols, cols,
                             yp + r0 * N + i0, N);
      }
    }
  });
#endif
  return y;
}

// y [M, N] = x [M, K] W^T, x float32, W dequantized chunk by chunk to fp32 (AVX2 and up): a chunk
// of weight rows is dequantized once into a small buffer that stays in cache and multiplied into
// every activation row in register tiles, so the codes are decoded once per call, not once per
// activation row as qlinear does.
at::Tensor qlinear_tiled(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                         int64_t cols, int64_t bits, int64_t block, int64_t offset, int64_t chunk_rows,
                         int64_t threads) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.size(1) == cols && x.is_contiguous(),
              "x: contiguous float32 [M, ", cols, "]");
  TORCH_CHECK(detected_isa() >= kAvx2, "qlinear_tiled needs AVX2 and FMA");
  const int64_t M = x.size(0), N = w.rows;
  at::Tensor y = at::empty({M, N}, x.options());
#ifdef TG_X86
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  RowFn dequantize_row = by_format(w, PickRowAvx2{});
  static const auto tiles = all_f32_tiles(std::make_index_sequence<kTileF32W>{});
  chunk_rows = std::max<int64_t>(chunk_rows, 1);
  parallel_chunks(N, chunk_rows, threads, [&](int64_t n0, int64_t n1) {
    std::vector<float> rows((n1 - n0) * w.padded_cols);
    for (int64_t n = n0; n < n1; ++n) dequantize_row(w, n, rows.data() + (n - n0) * w.padded_cols);
    for (int64_t r0 = 0; r0 < M; r0 += kTileF32R) {
      const int64_t r = std::min<int64_t>(kTileF32R, M - r0);
      for (int64_t i0 = n0; i0 < n1; i0 += kTileF32W) {
        const int64_t nw = std::min<int64_t>(kTileF32W, n1 - i0);
        tiles[nw - 1][r - 1](rows.data() + (i0 - n0) * w.padded_cols, w.padded_cols, xp + r0 * cols, cols,
                             yp + r0 * N + i0, N);
      }
    }
  });
#endif
  return y;
}

// The weights [N, K] as float32, bit for bit the gguf package's dequantization.
at::Tensor qdequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins, int64_t cols,
                       int64_t bits, int64_t block, int64_t offset, int64_t isa) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  isa = clamp_isa(isa);
  at::Tensor out = at::empty({w.rows, cols}, codes.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  RowFn row_fn = isa >= kAvx512 ? by_format(w, PickRow{}) : isa == kAvx2 ? by_format(w, PickRowAvx2{}) : nullptr;
  parallel_chunks(w.rows, 64, at::get_num_threads(), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      if (row_fn != nullptr) {
        row_fn(w, n, op + n * cols);
      } else {
        dequantize_row_scalar(w, n, op + n * cols);
      }
    }
  });
  return out;
}

// The weights [N, K] as bfloat16 (the fp32 dequantization rounded to nearest even), AVX512-BF16 only.
at::Tensor qdequantize_bf16(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins, int64_t cols,
                            int64_t bits, int64_t block, int64_t offset, int64_t threads) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  TORCH_CHECK(detected_isa() >= kAvx512Bf16, "qdequantize_bf16 needs AVX512-BF16");
  at::Tensor out = at::empty({w.rows, cols}, codes.options().dtype(at::kBFloat16));
#ifdef TG_X86
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  RowBf16Fn dequantize_row = by_format(w, PickRowBf16{});
  parallel_chunks(w.rows, 64, threads, [&](int64_t n0, int64_t n1) {
    std::vector<float> scratch(w.padded_cols);
    std::vector<uint16_t> row(w.padded_cols);
    for (int64_t n = n0; n < n1; ++n) {
      dequantize_row(w, n, scratch.data(), row.data());
      std::memcpy(op + n * cols, row.data(), cols * sizeof(uint16_t));
    }
  });
#endif
  return out;
}

int64_t cpu_isa() { return detected_isa(); }

}  // namespace

TORCH_LIBRARY(tenantgate_quant, m) {
  m.def("qlinear(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int isa, int chunk_rows, int threads) -> Tensor");
  m.def("qlinear_bf16(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int chunk_rows, int threads) -> Tensor");
  m.def("qlinear_tiled(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int chunk_rows, int threads) -> Tensor");
  m.def("qdequantize(Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int isa) -> Tensor");
  m.def("qdequantize_bf16(Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int threads) -> Tensor");
  m.def("cpu_isa() -> int", &cpu_isa);
}

TORCH_LIBRARY_IMPL(tenantgate_quant, CPU, m) {
  m.impl("qlinear", qlinear);
  m.impl("qlinear_bf16", qlinear_bf16);
  m.impl("qlinear_tiled", qlinear_tiled);
  m.impl("qdequantize", qdequantize);
  m.impl("qdequantize_bf16", qdequantize_bf16);
}
