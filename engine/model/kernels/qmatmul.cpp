// Matrix products that read GGUF-quantized weights in place (engine/model/quant.py packs them).
//
// A packed weight [N, K] holds, per row, one small unsigned code per element and, per block of
// `block` elements (16 or 32), an fp32 scale and min:  w = scale * float(code - offset) + min.
// The products are computed in that order, as two roundings (this file is built with
// -ffp-contract=off), which is how the gguf package dequantizes, so the weights the kernels use
// are bit for bit those of the dequantized checkpoint. Codes of 4 bits are stored two to a byte:
// in each run of 64 elements, byte j holds element j in its low nibble and element 32 + j in
// its high one; codes of up to 8 bits take a byte each. Rows are padded to a multiple of 64
// elements (the padding has scale and min 0).
//
// y = x W^T is computed row by row: a weight row is decoded 16 elements at a time and multiplied
// into every activation row; each activation row keeps 4 fp32 accumulators (one per 16-element
// group of a 64-element run), summed at the end in a fixed order. A row's result therefore does
// not depend on how many rows the call has or where the row sits in it (the deterministic lane
// relies on that), only on the instruction set, which the caller chooses and the fingerprint
// records. Instruction sets are picked from what the CPU reports at run time (AVX-512, AVX2+FMA),
// with a portable scalar path for every other CPU.
//
// Threads: torch's own pool (at::parallel_for), so torch.set_num_threads governs both. Weight
// rows are handed out in chunks from a shared counter rather than split evenly up front, so a
// thread that loses its core to another process delays the call by at most its current chunk.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TG_X86 1
#endif

namespace {

enum Isa : int64_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

int64_t detected_isa() {
#ifdef TG_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
    return kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kAvx2;
#endif
  return kScalar;
}

struct Packed {
  const uint8_t* codes;
  const float* scales;
  const float* mins;
  int64_t rows, cols, padded_cols;  // K and K rounded up to 64
  int64_t bits, block, offset;

  int64_t row_bytes() const { return bits == 4 ? padded_cols / 2 : padded_cols; }
  int64_t row_blocks() const { return padded_cols / block; }
  const uint8_t* row_codes(int64_t n) const { return codes + n * row_bytes(); }
  const float* row_scales(int64_t n) const { return scales + n * row_blocks(); }
  const float* row_mins(int64_t n) const { return mins + n * row_blocks(); }
};

// The code of element k of a row.
inline int32_t code_at(const Packed& w, const uint8_t* q, int64_t k) {
  if (w.bits == 4) {
    int64_t run = k / 64, j = k % 64;
    uint8_t byte = q[run * 32 + (j % 32)];
    return j < 32 ? (byte & 0x0F) : (byte >> 4);
  }
  return q[k];
}

// -- scalar: any CPU ------------------------------------------------------------------------

void decode_row_scalar(const Packed& w, int64_t n, float* out) {
  const uint8_t* q = w.row_codes(n);
  const float* sc = w.row_scales(n);
  const float* mn = w.row_mins(n);
  for (int64_t k = 0; k < w.cols; ++k) {
    float scaled = sc[k / w.block] * static_cast<float>(code_at(w, q, k) - w.offset);
    out[k] = scaled + mn[k / w.block];
  }
}

// Rows [0, m) of x against one decoded weight row: 4 accumulators of 16 lanes per row, as the
// vector paths, so the scalar path is also independent of m.
void dot_rows_scalar(const float* wrow, int64_t cols, const float* x, int64_t m, float* y, int64_t ldy) {
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * cols;
    float acc[4][16] = {};
    for (int64_t k = 0; k < cols; ++k) {
      int64_t g = (k % 64) / 16, lane = k % 16;
      acc[g][lane] = acc[g][lane] + wrow[k] * xr[k];
    }
    float total = 0.0f;
    for (int lane = 0; lane < 16; ++lane) total += (acc[0][lane] + acc[1][lane]) + (acc[2][lane] + acc[3][lane]);
    y[r * ldy] = total;
  }
}

#ifdef TG_X86

// -- AVX-512 -----------------------------------------------------------------------------------

#define TG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

// The 64 codes of run `c` of a row as four groups of 16 int32.
TG_AVX512 inline void codes_avx512(const Packed& w, const uint8_t* q, int64_t c, __m512i g[4]) {
  if (w.bits == 4) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c * 32));
    __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i lo = _mm256_and_si256(v, mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    g[0] = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(lo));
    g[1] = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(lo, 1));
    g[2] = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(hi));
    g[3] = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(hi, 1));
  } else {
    for (int i = 0; i < 4; ++i) {
      g[i] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c * 64 + 16 * i)));
    }
  }
}

// Groups [0, groups) of run c, dequantized: scale * (code - offset) + min, two roundings.
TG_AVX512 inline void weights_avx512(const Packed& w, int64_t n, int64_t c, int groups, __m512 out[4]) {
  __m512i g[4];
  codes_avx512(w, w.row_codes(n), c, g);
  const float* sc = w.row_scales(n);
  const float* mn = w.row_mins(n);
  __m512i offset = _mm512_set1_epi32(static_cast<int32_t>(w.offset));
  for (int i = 0; i < groups; ++i) {
    int64_t b = (c * 64 + 16 * i) / w.block;
    __m512 code = _mm512_cvtepi32_ps(_mm512_sub_epi32(g[i], offset));
    out[i] = _mm512_add_ps(_mm512_mul_ps(code, _mm512_set1_ps(sc[b])), _mm512_set1_ps(mn[b]));
  }
}

TG_AVX512 void decode_row_avx512(const Packed& w, int64_t n, float* out) {
  int64_t runs = w.cols / 64;
  __m512 v[4];
  for (int64_t c = 0; c < runs; ++c) {
    weights_avx512(w, n, c, 4, v);
    for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out + c * 64 + 16 * i, v[i]);
  }
  if (w.cols % 64) {  // K is a multiple of 32: a last half run
    weights_avx512(w, n, runs, 2, v);
    for (int i = 0; i < 2; ++i) _mm512_storeu_ps(out + runs * 64 + 16 * i, v[i]);
  }
}

// R activation rows against weight row n, decoding it on the fly.
template <int R>
TG_AVX512 void dot_fused_avx512(const Packed& w, int64_t n, const float* x, float* y, int64_t ldy) {
  const int64_t K = w.cols, runs = K / 64;
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  __m512 v[4];
  for (int64_t c = 0; c < runs; ++c) {
    weights_avx512(w, n, c, 4, v);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i)
        acc[r][i] = _mm512_fmadd_ps(v[i], _mm512_loadu_ps(x + r * K + c * 64 + 16 * i), acc[r][i]);
  }
  if (K % 64) {
    weights_avx512(w, n, runs, 2, v);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 2; ++i)
        acc[r][i] = _mm512_fmadd_ps(v[i], _mm512_loadu_ps(x + r * K + runs * 64 + 16 * i), acc[r][i]);
  }
  for (int r = 0; r < R; ++r) {
    __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
    y[r * ldy] = _mm512_reduce_add_ps(sum);
  }
}

// R activation rows against a decoded weight row: the same arithmetic as dot_fused_avx512.
template <int R>
TG_AVX512 void dot_decoded_avx512(const float* wrow, int64_t K, const float* x, float* y, int64_t ldy) {
  const int64_t runs = K / 64;
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < runs; ++c)
    for (int i = 0; i < 4; ++i) {
      __m512 v = _mm512_loadu_ps(wrow + c * 64 + 16 * i);
      for (int r = 0; r < R; ++r)
        acc[r][i] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + r * K + c * 64 + 16 * i), acc[r][i]);
    }
  if (K % 64)
    for (int i = 0; i < 2; ++i) {
      __m512 v = _mm512_loadu_ps(wrow + runs * 64 + 16 * i);
      for (int r = 0; r < R; ++r)
        acc[r][i] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + r * K + runs * 64 + 16 * i), acc[r][i]);
    }
  for (int r = 0; r < R; ++r) {
    __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
    y[r * ldy] = _mm512_reduce_add_ps(sum);
  }
}

// -- AVX2 + FMA --------------------------------------------------------------------------------

#define TG_AVX2 __attribute__((target("avx2,fma")))

// Group i (of 16 elements) of run c, dequantized, as two vectors of 8.
TG_AVX2 inline void weights_avx2(const Packed& w, int64_t n, int64_t c, int i, __m256 out[2]) {
  const uint8_t* q = w.row_codes(n);
  __m128i bytes;
  if (w.bits == 4) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c * 32 + 16 * (i % 2)));
    __m128i mask = _mm_set1_epi8(0x0F);
    bytes = i < 2 ? _mm_and_si128(v, mask) : _mm_and_si128(_mm_srli_epi16(v, 4), mask);
  } else {
    bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c * 64 + 16 * i));
  }
  int64_t b = (c * 64 + 16 * i) / w.block;
  __m256 scale = _mm256_set1_ps(w.row_scales(n)[b]);
  __m256 min = _mm256_set1_ps(w.row_mins(n)[b]);
  __m256i offset = _mm256_set1_epi32(static_cast<int32_t>(w.offset));
  __m256i lo = _mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), offset);
  __m256i hi = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)), offset);
  out[0] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lo), scale), min);
  out[1] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(hi), scale), min);
}

TG_AVX2 void decode_row_avx2(const Packed& w, int64_t n, float* out) {
  __m256 v[2];
  for (int64_t start = 0; start < w.cols; start += 16) {
    weights_avx2(w, n, start / 64, static_cast<int>((start % 64) / 16), v);
    _mm256_storeu_ps(out + start, v[0]);
    _mm256_storeu_ps(out + start + 8, v[1]);
  }
}

TG_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Two accumulators of 8 per row (even and odd groups of 16): 16 registers hold 4 rows' sums.
template <int R>
TG_AVX2 void dot_fused_avx2(const Packed& w, int64_t n, const float* x, float* y, int64_t ldy) {
  const int64_t K = w.cols;
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  __m256 v[2];
  for (int64_t start = 0; start < K; start += 16) {
    weights_avx2(w, n, start / 64, static_cast<int>((start % 64) / 16), v);
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + r * K + start), acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + r * K + start + 8), acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum_avx2(_mm256_add_ps(acc[r][0], acc[r][1]));
}

template <int R>
TG_AVX2 void dot_decoded_avx2(const float* wrow, int64_t K, const float* x, float* y, int64_t ldy) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t start = 0; start < K; start += 16) {
    __m256 v0 = _mm256_loadu_ps(wrow + start), v1 = _mm256_loadu_ps(wrow + start + 8);
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm256_fmadd_ps(v0, _mm256_loadu_ps(x + r * K + start), acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(v1, _mm256_loadu_ps(x + r * K + start + 8), acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum_avx2(_mm256_add_ps(acc[r][0], acc[r][1]));
}

#endif  // TG_X86

// -- dispatch ----------------------------------------------------------------------------------

// Up to 4 rows of x (m of them) against weight row n, into y[r * ldy].
void dot_rows(int64_t isa, const Packed& w, int64_t n, const float* x, int64_t m, float* y, int64_t ldy,
              float* scratch) {
#ifdef TG_X86
  if (isa == kAvx512) {
    switch (m) {
      case 1: return dot_fused_avx512<1>(w, n, x, y, ldy);
      case 2: return dot_fused_avx512<2>(w, n, x, y, ldy);
      case 3: return dot_fused_avx512<3>(w, n, x, y, ldy);
      default: return dot_fused_avx512<4>(w, n, x, y, ldy);
    }
  }
  if (isa == kAvx2) {
    switch (m) {
      case 1: return dot_fused_avx2<1>(w, n, x, y, ldy);
      case 2: return dot_fused_avx2<2>(w, n, x, y, ldy);
      case 3: return dot_fused_avx2<3>(w, n, x, y, ldy);
      default: return dot_fused_avx2<4>(w, n, x, y, ldy);
    }
  }
#endif
  decode_row_scalar(w, n, scratch);
  dot_rows_scalar(scratch, w.cols, x, m, y, ldy);
}

void decode_row(int64_t isa, const Packed& w, int64_t n, float* out) {
#ifdef TG_X86
  if (isa == kAvx512) return decode_row_avx512(w, n, out);
  if (isa == kAvx2) return decode_row_avx2(w, n, out);
#endif
  decode_row_scalar(w, n, out);
}

// All m rows of x against a decoded weight row, 4 at a time.
void dot_decoded(int64_t isa, const float* wrow, int64_t K, const float* x, int64_t m, float* y, int64_t ldy) {
  for (int64_t r0 = 0; r0 < m; r0 += 4) {
    int64_t rows = std::min<int64_t>(4, m - r0);
    const float* xr = x + r0 * K;
    float* yr = y + r0 * ldy;
#ifdef TG_X86
    if (isa == kAvx512) {
      switch (rows) {
        case 1: dot_decoded_avx512<1>(wrow, K, xr, yr, ldy); continue;
        case 2: dot_decoded_avx512<2>(wrow, K, xr, yr, ldy); continue;
        case 3: dot_decoded_avx512<3>(wrow, K, xr, yr, ldy); continue;
        default: dot_decoded_avx512<4>(wrow, K, xr, yr, ldy); continue;
      }
    }
    if (isa == kAvx2) {
      switch (rows) {
        case 1: dot_decoded_avx2<1>(wrow, K, xr, yr, ldy); continue;
        case 2: dot_decoded_avx2<2>(wrow, K, xr, yr, ldy); continue;
        case 3: dot_decoded_avx2<3>(wrow, K, xr, yr, ldy); continue;
        default: dot_decoded_avx2<4>(wrow, K, xr, yr, ldy); continue;
      }
    }
#endif
    dot_rows_scalar(wrow, K, xr, rows, yr, ldy);
  }
}

Packed packed_of(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins, int64_t cols,
                 int64_t bits, int64_t block, int64_t offset) {
  TORCH_CHECK(codes.dtype() == at::kByte && codes.dim() == 2 && codes.is_contiguous(), "codes: contiguous uint8 [N, bytes]");
  TORCH_CHECK(scales.dtype() == at::kFloat && scales.is_contiguous() && mins.dtype() == at::kFloat && mins.is_contiguous(),
              "scales and mins: contiguous float32");
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  TORCH_CHECK(block == 16 || block == 32, "block must be 16 or 32");
  TORCH_CHECK(cols > 0 && cols % 32 == 0 && cols % block == 0, "cols must be a positive multiple of 32 and of block");
  Packed w{codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), mins.data_ptr<float>(), codes.size(0), cols,
           (cols + 63) / 64 * 64, bits, block, offset};
  TORCH_CHECK(codes.size(1) == w.row_bytes(), "codes: ", w.row_bytes(), " bytes per row expected");
  TORCH_CHECK(scales.numel() == w.rows * w.row_blocks() && mins.numel() == scales.numel(), "scales/mins: one per block");
  return w;
}

// Hands out [0, total) in chunks of `chunk` to torch's threads, first come first served.
template <typename F>
void parallel_chunks(int64_t total, int64_t chunk, const F& body) {
  int64_t chunks = (total + chunk - 1) / chunk;
  int64_t threads = std::min<int64_t>(at::get_num_threads(), chunks);
  if (threads <= 1) {
    body(0, total);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      body(c * chunk, std::min(total, (c + 1) * chunk));
    }
  });
}

int64_t clamp_isa(int64_t isa) { return std::min(std::max<int64_t>(isa, kScalar), detected_isa()); }

// y [M, N] = x [M, K] W^T, x float32 contiguous.
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                   int64_t cols, int64_t bits, int64_t block, int64_t offset, int64_t isa, int64_t chunk_rows) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.size(1) == cols && x.is_contiguous(),
              "x: contiguous float32 [M, ", cols, "]");
  isa = clamp_isa(isa);
  const int64_t M = x.size(0), N = w.rows;
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  parallel_chunks(N, std::max<int64_t>(chunk_rows, 1), [&](int64_t n0, int64_t n1) {
    std::vector<float> row(w.padded_cols);
    for (int64_t n = n0; n < n1; ++n) {
      if (M <= 4) {
        dot_rows(isa, w, n, xp, M, yp + n, N, row.data());
      } else {  // decode the row once for all M rows
        decode_row(isa, w, n, row.data());
        dot_decoded(isa, row.data(), cols, xp, M, yp + n, N);
      }
    }
  });
  return y;
}

// The weights [N, K] as float32.
at::Tensor qdequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins, int64_t cols,
                       int64_t bits, int64_t block, int64_t offset, int64_t isa) {
  Packed w = packed_of(codes, scales, mins, cols, bits, block, offset);
  isa = clamp_isa(isa);
  at::Tensor out = at::empty({w.rows, cols}, codes.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  parallel_chunks(w.rows, 64, [&](int64_t n0, int64_t n1) {
    std::vector<float> row(w.padded_cols);
    for (int64_t n = n0; n < n1; ++n) {
      decode_row(isa, w, n, row.data());
      std::memcpy(op + n * cols, row.data(), cols * sizeof(float));
    }
  });
  return out;
}

int64_t cpu_isa() { return detected_isa(); }

}  // namespace

TORCH_LIBRARY(tenantgate_quant, m) {
  m.def("qlinear(Tensor x, Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int isa, int chunk_rows) -> Tensor");
  m.def("qdequantize(Tensor codes, Tensor scales, Tensor mins, int cols, int bits, int block, int offset, "
        "int isa) -> Tensor");
  m.def("cpu_isa() -> int", &cpu_isa);
}

TORCH_LIBRARY_IMPL(tenantgate_quant, CPU, m) {
  m.impl("qlinear", qlinear);
  m.impl("qdequantize", qdequantize);
}
