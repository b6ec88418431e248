// Matrix products that read GGUF-quantized weights in place (engine/model/quant.py packs them).
//
// A packed weight [N, K] holds, per row, one small integer code c per element and, per block of
// BLOCK elements (16 or 32), an fp32 scale and min:  w = scale * float(c) + min.  Signed formats
// (Q8_0, Q4_0, Q5_0, Q3_K, Q6_K) store c = q - offset in two's complement and have no min;
// unsigned ones (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) store q and a min per block. Codes of 4 bits are
// stored two to a byte: in each run of 64 elements, byte j holds element j in its low nibble and
// element 32 + j in its high one; wider codes take a byte each. Rows are padded to whole runs.
//
// Three products:
//  - qlinear (fp32 activations, any row count): per block, the codes as floats are multiplied
//    into x and summed, then scaled; the mins multiply per-block sums of x:
//        y = sum_b scale_b * sum_{k in b} c_k x_k  +  sum_b min_b * sum_{k in b} x_k.
//    Each output is an fp32 evaluation of the exact dot product of x with scale * c + min.
//  - qlinear_bf16 (bf16 activations, AVX512-BF16 only): each weight row is dequantized once
//    (scale * c + min in fp32, rounded to bf16, as a dense bf16 copy of the dequantized checkpoint
//    would hold it) and multiplied into up to 4 activation rows at a time with bf16 dot products.
//  - qlinear_amx (bf16 activations, CPUs with AMX-BF16): as qlinear_bf16, a chunk of weight rows
//    dequantized to bf16 once, then multiplied with AMX tiles (tdpbf16ps) 32 x 32 rows at a time.
// In all three, a row's result depends on its own values only, never on how many rows the call has or
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

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#define TG_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

enum Isa : int64_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };

bool amx_usable();

int64_t detected_isa() {
#ifdef TG_X86
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return amx_usable() ? kAmx : kAvx512Bf16;
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

// -- AMX-BF16: bf16 activations, many rows -------------------------------------------------------

#define TG_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,amx-tile,amx-bf16")))

// AMX's tile registers need the kernel's leave (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA)
// once per process before any thread touches them; the CPU must report AMX-TILE and AMX-BF16.
bool amx_usable() {
  static const bool usable = [] {
#if defined(__linux__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
#else
    return false;
#endif
  }();
  return usable;
}

// The tile layout every AMX call uses: tiles 0-3 the fp32 sums of 16 weight rows by 16 activation
// rows, 4-5 two weight tiles (16 rows x 32 bf16 of k), 6-7 two activation tiles (16 pairs of k x 16
// rows, the pairs interleaved as tdpbf16ps wants them).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TG_AMX void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC 12 does not see that ldtilecfg reads cfg and drops the stores above without this barrier.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

TG_AMX void amx_release() { _tile_release(); }

// y^T for 32 weight rows (wt, bf16, `ldw` elements apart) and 32 activation rows (xb: for each 32
// elements of k, two packed activation tiles of 1,024 bytes, one after the other):
// c [2][2][16][16] fp32, c[i][j][n][m] the sum for weight row 16i + n and activation row 16j + m.
// Each sum runs over k in order (tdpbf16ps adds a pair's two products, then the next pair's), the
// same operations for a row wherever it sits in the call, so a row's result does not depend on the
// call's row count or the row's place in it.
TG_AMX void tile_amx(const uint16_t* wt, int64_t ldw, const uint16_t* xb, int64_t kt, float* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t t = 0; t < kt; ++t) {
    _tile_loadd(4, wt + t * 32, ldw * 2);
    _tile_loadd(5, wt + 16 * ldw + t * 32, ldw * 2);
    _tile_loadd(6, xb + t * 1024, 64);
    _tile_loadd(7, xb + t * 1024 + 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
}

// The 16 x 16 fp32 tile c (row n, column m) transposed and rounded to bf16 (nearest even, denormals
// flushed to zero as vcvtneps2bf16 does): row m of it to y + m * ldy, its first `cols` values, for
// rows m < `rows`.
TG_AMX void store_transposed(const float* c, int64_t rows, int64_t cols, uint16_t* y, int64_t ldy) {
  __m512 t[16], u[16];
  for (int k = 0; k < 8; ++k) {  // within 128-bit lanes: pairs of rows interleaved
    const __m512 a = _mm512_loadu_ps(c + 32 * k), b = _mm512_loadu_ps(c + 32 * k + 16);
    t[2 * k] = _mm512_unpacklo_ps(a, b);
    t[2 * k + 1] = _mm512_unpackhi_ps(a, b);
  }
  for (int k = 0; k < 4; ++k) {  // u[4k + j], lane L: rows 4k..4k+3 of column 4L + j
    u[4 * k] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
    u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
  const __mmask16 live = cols >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << cols) - 1);
  for (int j = 0; j < 4; ++j) {  // the 4 x 4 transpose of 128-bit lanes: column 4L + j is lane L of u[j], u[4 + j], ...
    const __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44), v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
    const __m512 col[4] = {_mm512_shuffle_f32x4(v0, v2, 0x88), _mm512_shuffle_f32x4(v0, v2, 0xDD),
                           _mm512_shuffle_f32x4(v1, v3, 0x88), _mm512_shuffle_f32x4(v1, v3, 0xDD)};
    for (int L = 0; L < 4; ++L) {
      const int64_t m = 4 * L + j;
      if (m < rows) _mm256_mask_storeu_epi16(y + m * ldy, live, (__m256i)_mm512_cvtneps_pbh(col[L]));
    }
  }
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

// y [M, N] = x [M, K] W^T over fp32 rows (xp, yp contiguous).
void qlinear_rows(const Packed& w, const float* xp, int64_t M, float* yp, int64_t isa, int64_t chunk_rows,
                  int64_t threads) {
  const int64_t cols = w.cols, N = w.rows, blocks = cols / w.block;
  std::vector<float> xsum(w.is_signed ? 0 : M * blocks);
  if (!w.is_signed) block_sums(xp, M, cols, w.block, xsum.data());
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
}

// y [M, N] = x [M, K] W^T, x float32.
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                   int64_t cols, int64_t bits, int64_t block, int64_t offset, int64_t isa, int64_t chunk_rows,
                   int64_t threads) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.size(1) == cols && x.is_contiguous(),
              "x: contiguous float32 [M, ", cols, "]");
  at::Tensor y = at::empty({x.size(0), w.rows}, x.options());
  qlinear_rows(w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>(), clamp_isa(isa), chunk_rows, threads);
  return y;
}

// qlinear of x in float32 or bfloat16, y in x's dtype: for bfloat16, x widened to fp32 and y rounded
// to nearest even, bit for bit qlinear(x.float()).to(x.dtype) without those two ops' dispatch (a
// decode step's projections take one row each).
at::Tensor qlinear_cast(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                        int64_t cols, int64_t bits, int64_t block, int64_t offset, int64_t isa, int64_t chunk_rows,
                        int64_t threads) {
  if (x.dtype() == at::kFloat)
    return qlinear(x.contiguous(), codes, scales, mins, cols, bits, block, offset, isa, chunk_rows, threads);
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  TORCH_CHECK(x.dtype() == at::kBFloat16 && x.dim() == 2 && x.size(1) == cols && x.stride(1) == 1,
              "x: float32 or bfloat16 [M, ", cols, "] with unit column stride");
  const int64_t M = x.size(0), N = w.rows;
  std::vector<float> xf(M * cols), yf(M * N);
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < cols; ++k) xf[r * cols + k] = static_cast<float>(xp[r * x.stride(0) + k]);
  qlinear_rows(w, xf.data(), M, yf.data(), clamp_isa(isa), chunk_rows, threads);
  at::Tensor y = at::empty({M, N}, x.options());
  c10::BFloat16* yp = y.data_ptr<c10::BFloat16>();
  for (int64_t i = 0; i < M * N; ++i) yp[i] = static_cast<c10::BFloat16>(yf[i]);
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

// y [M, N] = x [M, K] W^T in bfloat16, x bfloat16, by AMX (the CPU has it and the kernel allows it):
// each chunk of weight rows is dequantized to bfloat16 once (the values a dense bf16 copy holds)
// into a buffer that stays in cache, and multiplied into every activation row 32 x 32 at a time
// with tdpbf16ps; the fp32 sums are rounded to bf16 as a dense bf16 matmul rounds its output. The
// activations are repacked once per call into the pairs-of-k layout the tiles read.
at::Tensor qlinear_amx(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                       int64_t cols, int64_t bits, int64_t block, int64_t offset, int64_t chunk_rows,
                       int64_t threads) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  TORCH_CHECK(x.dtype() == at::kBFloat16 && x.dim() == 2 && x.size(1) == cols && x.is_contiguous(),
              "x: contiguous bfloat16 [M, ", cols, "]");
  TORCH_CHECK(detected_isa() >= kAmx, "qlinear_amx needs AMX-BF16");
  const int64_t M = x.size(0), N = w.rows, steps = cols / 32, pairs = (M + 31) / 32;
  at::Tensor y = at::empty({M, N}, x.options());
#ifdef TG_X86
  // xb[pair][step]: two tiles of 16 k-pairs x 16 rows (rows 32 * pair + 0..15, then + 16..31),
  // each entry two bf16 (k, k + 1) as one 32-bit word; rows past M stay zero.
  std::vector<uint32_t> xb(pairs * steps * 512, 0);
  const uint32_t* x32 = reinterpret_cast<const uint32_t*>(x.data_ptr());
  for (int64_t m = 0; m < M; ++m) {
    uint32_t* dst = xb.data() + (m / 32) * steps * 512 + ((m % 32) / 16) * 256 + m % 16;
    const uint32_t* src = x32 + m * (cols / 2);
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t p = 0; p < 16; ++p) dst[t * 512 + p * 16] = src[t * 16 + p];
  }
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  RowBf16Fn dequantize_row = by_format(w, PickRowBf16{});
  const int64_t ldw = w.padded_cols;
  chunk_rows = std::max<int64_t>((chunk_rows + 31) / 32 * 32, 32);
  parallel_chunks(N, chunk_rows, threads, [&](int64_t n0, int64_t n1) {
    amx_configure();  // tile configuration is per thread
    std::vector<uint16_t> rows(32 * ldw, 0);  // rows past the chunk's end stay as they were: finite
    std::vector<float> scratch(ldw);
    alignas(64) float c[1024];
    for (int64_t g = n0; g < n1; g += 32) {
      const int64_t live = std::min<int64_t>(32, n1 - g);
      for (int64_t n = 0; n < live; ++n) dequantize_row(w, g + n, scratch.data(), rows.data() + n * ldw);
      for (int64_t pair = 0; pair < pairs; ++pair) {
        tile_amx(rows.data(), ldw, reinterpret_cast<const uint16_t*>(xb.data() + pair * steps * 512), steps, c);
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) {
            const int64_t m0 = pair * 32 + 16 * j;
            if (16 * i < live && m0 < M)
              store_transposed(c + (2 * i + j) * 256, M - m0, live - 16 * i, yp + m0 * N + g + 16 * i, N);
          }
      }
    }
    amx_release();
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

// -- the decode path's small ops -----------------------------------------------------------------
//
// At one row a decode step's norms, rotary, SiLU and attention cost more in PyTorch's per-op
// dispatch (3-8 us each, a dozen of them a layer) than in arithmetic, so each is one op here
// (engine/model/llama.py uses them where these kernels are loaded: CPU, quantized weights). Every
// op works row by row (a row's result depends on that row only, never on the call's row count or
// the row's place: the deterministic lane relies on it) and takes float32 or bfloat16. bfloat16
// values are widened to fp32, and every result PyTorch's bfloat16 ops would round is rounded the
// same way (nearest even), so rotary and the residual add are bit for bit PyTorch's; the norm's sum
// of squares, SiLU's exp and attention's softmax are fp32 evaluations of their own order.
// Plain C++ that the compiler vectorizes; per-row sums run in 16 fixed lanes so their order does
// not depend on the instruction set the compiler picked.

constexpr int kLanes = 16;

inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }
template <typename T>
inline T narrow(float v) { return static_cast<T>(v); }  // c10::BFloat16(float) rounds to nearest even

// sum of v[0, n) in kLanes lanes, then the lanes in order.
inline float lane_sum(const float* v, int64_t n) {
  float lanes[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += v[k + l];
  for (int l = 0; k < n; ++k, ++l) lanes[l] += v[k];
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  return s;
}

inline float dot_lanes(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[k + l] * b[k + l];
  for (int l = 0; k < n; ++k, ++l) lanes[l] += a[k] * b[k];
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  return s;
}

// exp(x) in fp32 (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, 2^n from the exponent
// bits), branch-free so loops of it vectorize; within 2 ulp of expf over [-87, 88] (x is clamped to
// it: below, about 1e-38 where expf gives less).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

template <typename F>
void for_rows(int64_t rows, int64_t grain, const F& body) {
  if (rows <= grain || at::in_parallel_region()) {
    body(0, rows);
    return;
  }
  at::parallel_for(0, rows, grain, body);
}

#define TG_DISPATCH_FLOAT(dtype, ...)                                                   \
  [&] {                                                                                \
    if ((dtype) == at::kBFloat16) {                                                    \
      using scalar_t = c10::BFloat16;                                                  \
      return __VA_ARGS__();                                                            \
    }                                                                                  \
    TORCH_CHECK((dtype) == at::kFloat, "float32 or bfloat16 tensors expected");       \
    using scalar_t = float;                                                            \
    return __VA_ARGS__();                                                              \
  }()

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.stride(1) == 1, name, ": a CPU [rows, width] tensor with unit column stride");
}

// x [M, H] += delta (when given, in place: the residual stream), then returns
// weight * (x * rsqrt(mean(x^2) + eps)), as engine/model/llama.py's RMSNorm computes it (fp32
// normalisation, rounded to the dtype, then scaled by the weight in the dtype).
at::Tensor rms_norm(at::Tensor x, const c10::optional<at::Tensor>& delta, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  const int64_t M = x.size(0), H = x.size(1);
  TORCH_CHECK(weight.dtype() == x.dtype() && weight.is_contiguous() && weight.numel() == H, "weight: [H] in x's dtype");
  if (delta.has_value()) {
    check_rows(*delta, "delta");
    TORCH_CHECK(delta->dtype() == x.dtype() && delta->size(0) == M && delta->size(1) == H, "delta: x's shape and dtype");
  }
  at::Tensor out = at::empty({M, H}, x.options());
  TG_DISPATCH_FLOAT(x.scalar_type(), [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* dp = delta.has_value() ? delta->data_ptr<scalar_t>() : nullptr;
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int64_t ldx = x.stride(0), ldd = delta.has_value() ? delta->stride(0) : 0;
    for_rows(M, 16, [&](int64_t r0, int64_t r1) {
      std::vector<float> xf(H), sq(H);
      for (int64_t r = r0; r < r1; ++r) {
        scalar_t* xr = xp + r * ldx;
        if (dp != nullptr) {
          const scalar_t* dr = dp + r * ldd;
          for (int64_t k = 0; k < H; ++k) xr[k] = narrow<scalar_t>(widen(xr[k]) + widen(dr[k]));
        }
        for (int64_t k = 0; k < H; ++k) {
          xf[k] = widen(xr[k]);
          sq[k] = xf[k] * xf[k];
        }
        const float inv = 1.0f / std::sqrt(lane_sum(sq.data(), H) / static_cast<float>(H) + static_cast<float>(eps));
        scalar_t* orow = op + r * H;
        for (int64_t k = 0; k < H; ++k) orow[k] = narrow<scalar_t>(widen(wp[k]) * widen(narrow<scalar_t>(xf[k] * inv)));
      }
    });
  });
  return out;
}

// Rotates, in place, the first `heads` heads of each row of x [T, >= heads * D] by the row's
// cos and sin [T, 1, D] (RotaryEmbedding.tables): x * cos + rotate_half(x) * sin, each product and
// the sum rounded to the dtype as PyTorch's ops round them.
void rotary_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads, int64_t head_dim) {
  check_rows(x, "x");
  const int64_t T = x.size(0), D = head_dim, half = D / 2;
  TORCH_CHECK(D % 2 == 0 && heads * D <= x.size(1), "x: rows of at least heads * head_dim, head_dim even");
  TORCH_CHECK(cos.dtype() == x.dtype() && sin.dtype() == x.dtype() && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.numel() == T * D && sin.numel() == T * D,
              "cos, sin: contiguous [T, 1, head_dim] in x's dtype");
  TG_DISPATCH_FLOAT(x.scalar_type(), [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* sp = sin.data_ptr<scalar_t>();
    const int64_t ldx = x.stride(0);
    for_rows(T, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t t = r0; t < r1; ++t) {
        const scalar_t* c = cp + t * D;
        const scalar_t* s = sp + t * D;
        for (int64_t h = 0; h < heads; ++h) {
          scalar_t* v = xp + t * ldx + h * D;
          for (int64_t j = 0; j < half; ++j) {
            const float a = widen(v[j]), b = widen(v[j + half]);
            const float lo = widen(narrow<scalar_t>(a * widen(c[j]))) + widen(narrow<scalar_t>(-b * widen(s[j])));
            const float hi = widen(narrow<scalar_t>(b * widen(c[j + half]))) + widen(narrow<scalar_t>(a * widen(s[j + half])));
            v[j] = narrow<scalar_t>(lo);
            v[j + half] = narrow<scalar_t>(hi);
          }
        }
      }
    });
  });
}

// silu(gate) * up of x [M, 2I] = [gate | up] (the fused gate_up projection's output): [M, I].
at::Tensor silu_mul(const at::Tensor& x) {
  check_rows(x, "x");
  const int64_t M = x.size(0), I = x.size(1) / 2;
  TORCH_CHECK(x.size(1) % 2 == 0, "x: an even width");
  at::Tensor out = at::empty({M, I}, x.options());
  TG_DISPATCH_FLOAT(x.scalar_type(), [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int64_t ldx = x.stride(0);
    for_rows(M, 8, [&](int64_t r0, int64_t r1) {
      std::vector<float> g(I);
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* gate = xp + r * ldx;
        const scalar_t* up = gate + I;
        for (int64_t k = 0; k < I; ++k) {
          const float v = widen(gate[k]);
          g[k] = v / (1.0f + exp_approx(-v));
        }
        scalar_t* orow = op + r * I;
        for (int64_t k = 0; k < I; ++k) orow[k] = narrow<scalar_t>(widen(narrow<scalar_t>(g[k])) * widen(up[k]));
      }
    });
  });
  return out;
}

// One KV head's attention for one query row: qf [group, D] (scaled, fp32) over the n keys and
// values at k_rows[j], v_rows[j] (D each); scores [group, L] is scratch, acc [group, D] receives
// the unnormalised sums and total [group] the softmax denominators.
template <typename T>
void attend_scalar(const float* qf, const T* const* k_rows, const T* const* v_rows, int64_t n, int64_t group,
                   int64_t D, int64_t L, float* kv, float* scores, float* acc, float* total) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t d = 0; d < D; ++d) kv[d] = widen(k_rows[j][d]);
    for (int64_t i = 0; i < group; ++i) scores[i * L + j] = dot_lanes(qf + i * D, kv, D);
  }
  for (int64_t i = 0; i < group; ++i) {
    float* s = scores + i * L;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) top = std::max(top, s[j]);
    for (int64_t j = 0; j < n; ++j) s[j] = exp_approx(s[j] - top);
    total[i] = lane_sum(s, n);
  }
  std::fill(acc, acc + group * D, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t d = 0; d < D; ++d) kv[d] = widen(v_rows[j][d]);
    for (int64_t i = 0; i < group; ++i) {
      const float p = scores[i * L + j];
      for (int64_t d = 0; d < D; ++d) acc[i * D + d] += p * kv[d];
    }
  }
}

#ifdef TG_X86
TG_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
TG_AVX512 inline __m512 load16(const c10::BFloat16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// exp_approx on 16 lanes, the same operations in the same order.
TG_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.0f));
  const __m512 round = _mm512_set1_ps(12582912.0f);
  __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), round), round);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
  p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
  __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// attend_scalar with 16-lane vectors (D a multiple of 16, group at most 8): fused multiply-adds,
// so the last bits differ from the scalar path's (the caller's instruction set decides which runs).
template <typename T>
TG_AVX512 void attend_avx512(const float* qf, const T* const* k_rows, const T* const* v_rows, int64_t n,
                             int64_t group, int64_t D, int64_t L, float* scores, float* acc, float* total) {
  for (int64_t j = 0; j < n; ++j) {
    __m512 dot[8];
    for (int64_t i = 0; i < group; ++i) dot[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 kv = load16(k_rows[j] + d);
      for (int64_t i = 0; i < group; ++i) dot[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qf + i * D + d), kv, dot[i]);
    }
    for (int64_t i = 0; i < group; ++i) scores[i * L + j] = _mm512_reduce_add_ps(dot[i]);
  }
  for (int64_t i = 0; i < group; ++i) {
    float* s = scores + i * L;
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(s + j));
    if (j < n) top = _mm512_max_ps(top, _mm512_mask_loadu_ps(top, static_cast<__mmask16>((1u << (n - j)) - 1), s + j));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j < n; j += 16) {
      const __mmask16 live = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + j), m));
      _mm512_mask_storeu_ps(s + j, live, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(live, e));
    }
    total[i] = _mm512_reduce_add_ps(sum);
  }
  for (int64_t d0 = 0; d0 < D; d0 += 64) {  // 64 columns of every head's sums in registers
    const int64_t width = std::min<int64_t>(64, D - d0);
    __m512 a[8][4];
    for (int64_t i = 0; i < group; ++i)
      for (int c = 0; c < 4; ++c) a[i][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < width / 16; ++c) {
        const __m512 vv = load16(v_rows[j] + d0 + 16 * c);
        for (int64_t i = 0; i < group; ++i) a[i][c] = _mm512_fmadd_ps(_mm512_set1_ps(scores[i * L + j]), vv, a[i][c]);
      }
    }
    for (int64_t i = 0; i < group; ++i)
      for (int64_t c = 0; c < width / 16; ++c) _mm512_storeu_ps(acc + i * D + d0 + 16 * c, a[i][c]);
  }
}
#endif

// One query per row over its paged context: q [B, H, D] (rows and heads may be strided), the pool's
// k_cache, v_cache [blocks, block_size, Hkv, D], each row's block table [B, n] and key mask
// [B, 1, 1, n * block_size] (True: attend; as model_runner builds them for decodes). With k, v
// [B, Hkv, D] and slots [B], the rows' own keys and values are written to the pool first, all of
// them before any row is read. Scores, softmax and the weighted sum of values in fp32, keys in
// order; the output [B, H, D] is rounded to q's dtype. isa (at most the CPU's) picks AVX-512 or
// the scalar path.
at::Tensor decode_attention(const at::Tensor& q, at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& tables,
                            const at::Tensor& mask, double scale, const c10::optional<at::Tensor>& k,
                            const c10::optional<at::Tensor>& v, const c10::optional<at::Tensor>& slots, int64_t isa) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q: [B, H, D] with unit stride in D");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && k_cache.dtype() == q.dtype() && v_cache.dtype() == q.dtype(),
              "caches: contiguous [blocks, block_size, Hkv, D] in q's dtype");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t BS = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && H % Hkv == 0, "q and the caches disagree on head_dim or heads");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == B && tables.dtype() == at::kLong && tables.is_contiguous(),
              "tables: contiguous int64 [B, blocks]");
  const int64_t L = tables.size(1) * BS;
  TORCH_CHECK(mask.dtype() == at::kBool && mask.is_contiguous() && mask.numel() == B * L, "mask: contiguous bool [B, 1, 1, blocks * block_size]");
  const int64_t group = H / Hkv, row_elems = Hkv * D;
  at::Tensor out = at::empty({B, H, D}, q.options());
  TG_DISPATCH_FLOAT(q.scalar_type(), [&] {
    scalar_t* kc = k_cache.data_ptr<scalar_t>();
    scalar_t* vc = v_cache.data_ptr<scalar_t>();
    if (slots.has_value()) {
      TORCH_CHECK(k.has_value() && v.has_value(), "k, v and slots go together");
      TORCH_CHECK(slots->dtype() == at::kLong && slots->is_contiguous() && slots->numel() == B, "slots: int64 [B]");
      const int64_t* sp = slots->data_ptr<int64_t>();
      const int64_t pool = k_cache.size(0) * BS;
      for (const at::Tensor* src : {&*k, &*v}) {
        TORCH_CHECK(src->dim() == 3 && src->size(0) == B && src->size(1) == Hkv && src->size(2) == D &&
                        src->stride(2) == 1 && src->dtype() == q.dtype(),
                    "k, v: [B, Hkv, D] in q's dtype with unit stride in D");
        scalar_t* dst = src == &*k ? kc : vc;
        const scalar_t* base = src->data_ptr<scalar_t>();
        for (int64_t b = 0; b < B; ++b) {
          TORCH_CHECK(sp[b] >= 0 && sp[b] < pool, "slot out of range");
          for (int64_t h = 0; h < Hkv; ++h)
            std::memcpy(dst + sp[b] * row_elems + h * D, base + b * src->stride(0) + h * src->stride(1), D * sizeof(scalar_t));
        }
      }
    }
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const int64_t* tp = tables.data_ptr<int64_t>();
    const bool* mp = mask.data_ptr<bool>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int64_t blocks = k_cache.size(0);
    const bool vector = clamp_isa(isa) >= kAvx512 && D % 16 == 0 && group <= 8;
    for_rows(B * Hkv, 1, [&](int64_t w0, int64_t w1) {
      std::vector<float> qf(group * D), kv(D), scores(group * L), acc(group * D), total(group);
      std::vector<const scalar_t*> k_rows(L), v_rows(L);
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t b = w / Hkv, g = w % Hkv;
        int64_t n = 0;  // the visible keys' pool rows, oldest first
        for (int64_t j = 0; j < L; ++j) {
          if (!mp[b * L + j]) continue;
          const int64_t block = tp[b * tables.size(1) + j / BS];
          TORCH_CHECK(block >= 0 && block < blocks, "block out of range");
          const int64_t row = (block * BS + j % BS) * row_elems + g * D;
          k_rows[n] = kc + row;
          v_rows[n++] = vc + row;
        }
        for (int64_t i = 0; i < group; ++i) {
          const scalar_t* qr = qp + b * q.stride(0) + (g * group + i) * q.stride(1);
          for (int64_t d = 0; d < D; ++d) qf[i * D + d] = widen(qr[d]) * static_cast<float>(scale);
        }
#ifdef TG_X86
        if (vector) {
          attend_avx512<scalar_t>(qf.data(), k_rows.data(), v_rows.data(), n, group, D, L, scores.data(), acc.data(),
                                  total.data());
        } else
#endif
        {
          attend_scalar<scalar_t>(qf.data(), k_rows.data(), v_rows.data(), n, group, D, L, kv.data(), scores.data(),
                                  acc.data(), total.data());
        }
        for (int64_t i = 0; i < group; ++i) {
          scalar_t* orow = op + (b * H + g * group + i) * D;
          const float inv = n > 0 ? 1.0f / total[i] : 0.0f;
          for (int64_t d = 0; d < D; ++d) orow[d] = narrow<scalar_t>(acc[i * D + d] * inv);
        }
      }
    });
  });
  return out;
}

int64_t cpu_isa() { return detected_isa(); }

}  // namespace

TORCH_LIBRARY(tenantgate_quant, m) {
  m.def("qlinear(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int isa, int chunk_rows, int threads) -> Tensor");
  m.def("qlinear_cast(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int isa, int chunk_rows, int threads) -> Tensor");
  m.def("qlinear_bf16(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int chunk_rows, int threads) -> Tensor");
  m.def("qlinear_amx(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int chunk_rows, int threads) -> Tensor");
  m.def("qlinear_tiled(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int chunk_rows, int threads) -> Tensor");
  m.def("qdequantize(Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int isa) -> Tensor");
  m.def("qdequantize_bf16(Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int threads) -> Tensor");
  m.def("cpu_isa() -> int", &cpu_isa);
  m.def("rms_norm(Tensor(a!) x, Tensor? delta, Tensor weight, float eps) -> Tensor");
  m.def("rotary_(Tensor(a!) x, Tensor cos, Tensor sin, int heads, int head_dim) -> ()");
  m.def("silu_mul(Tensor x) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor tables, Tensor mask, float scale, "
        "Tensor? k, Tensor? v, Tensor? slots, int isa=3) -> Tensor");
}

TORCH_LIBRARY_IMPL(tenantgate_quant, CPU, m) {
  m.impl("qlinear", qlinear);
  m.impl("qlinear_cast", qlinear_cast);
  m.impl("qlinear_bf16", qlinear_bf16);
  m.impl("qlinear_amx", qlinear_amx);
  m.impl("qlinear_tiled", qlinear_tiled);
  m.impl("qdequantize", qdequantize);
  m.impl("qdequantize_bf16", qdequantize_bf16);
  m.impl("rms_norm", rms_norm);
  m.impl("rotary_", rotary_);
  m.impl("silu_mul", silu_mul);
  m.impl("decode_attention", decode_attention);
}
