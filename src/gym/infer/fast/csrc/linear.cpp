// Kernels for decoding on the CPU. Matrix-vector products: y[b, n] = sum_k x[b, k] * W[n, k] for a few rows b.
//
// Decoding one token reads every weight once and does two flops per weight, so a decode step is
// bound by memory bandwidth, and what a kernel must do is stream the weights once at full speed
// while every activation row of the batch reuses each weight it loaded. BLAS libraries tune for
// large matrix products and reach a fraction of the bandwidth at one to sixteen rows; these kernels
// are written for that shape. Weights are float32, bfloat16 or float16 (widened to float32 in
// registers), or int8 / int4 in blocks of 32 with one float16 scale per block; for the integer
// formats the activations are quantized to int8 per block as well, so the inner loop is an 8-bit
// integer dot product (AVX-VNNI / AVX512-VNNI where the CPU has it, AVX2 otherwise).
//
// The threads are a pool of our own (parallel_for below), as many as torch's intra-op threads. A decode
// step calls ~200 kernels of 10-50 microseconds each, so waking the threads must cost well under a
// microsecond: the workers spin briefly between kernels and sleep when the step is over. OpenMP's
// teams (ATen's at::parallel_for) cannot be used for this: libgomp throttles spinning to almost nothing
// once a process holds more OpenMP threads than cores, which it does as soon as a second thread (the
// inference engine's, beside the main one) runs a parallel region, and every kernel then waits on a
// futex wake-up: measured 150 instead of 45 microseconds per int8 layer, half the decode speed.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <tuple>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "ops.h"

// This file is compiled once per instruction set (isa_*.cpp define GYM_ISA_NS and one GYM_ISA_* macro) into
// one library, whose dispatch.cpp picks the variant the CPU runs best. The instruction set is a GCC target
// pragma placed after every header, never a -march flag: the headers' inline functions (ATen's, the standard
// library's) are then compiled for the baseline in every variant, so whichever copy the linker keeps runs on
// any x86-64. Only this file's own functions, in GYM_ISA_NS, use the variant's instructions. G++ does not
// update __AVX2__ and the like after a target pragma (it reads the whole file before the pragmas apply), so
// the code below tests our own GYM_AVX2 / GYM_AVX512 / GYM_VNNI512, set here from the variant. The feature
// lists are x86-64-v3 and -v4 (plus VNNI), what dispatch.cpp checks the CPU for; "arch=haswell" in a pragma
// does not let G++ inline the intrinsics.
#ifndef GYM_ISA_NS
#error "compile linear.cpp through one of the isa_*.cpp files"
#endif
#if defined(GYM_ISA_AVX512_VNNI)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,movbe,avx512f,avx512bw,avx512cd,avx512dq,avx512vl,avx512vnni")
#define GYM_AVX2 1
#define GYM_AVX512 1
#define GYM_VNNI512 1
#elif defined(GYM_ISA_AVX512)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,movbe,avx512f,avx512bw,avx512cd,avx512dq,avx512vl")
#define GYM_AVX2 1
#define GYM_AVX512 1
#elif defined(GYM_ISA_AVX2)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,movbe")
#define GYM_AVX2 1
#endif
#ifdef GYM_AVX2
#include <immintrin.h>
#endif

namespace GYM_ISA_NS {
namespace {

// A fixed team of workers for parallel_for. One caller at a time uses the team; a second concurrent
// caller (another engine's thread) or a nested call runs its loop on its own thread instead of waiting.
class SpinPool {
 public:
  static SpinPool& instance() {
    static SpinPool* pool = new SpinPool();  // never destroyed: workers may outlive static destructors
    return *pool;
  }

  template <class F>
  void run(int64_t begin, int64_t end, int64_t grain, const F& body, int64_t piece = 0) {
    const int64_t count = end - begin;
    if (count <= 0) return;
    const int threads = std::max(1, at::get_num_threads());
    int64_t parts = std::min<int64_t>(threads, (count + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (parts <= 1 || inside_ || !busy.owns_lock()) {
      body(begin, end);
      return;
    }
    ensure_workers(threads - 1);
    parts = std::min<int64_t>(parts, int64_t(workers_->size()) + 1);
    const int64_t chunk = (count + parts - 1) / parts;
    Job job{[](const void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); }, &body, begin, end,
            chunk, parts, piece > 0 && count > piece * parts ? piece : 0};
    next_.store(begin, std::memory_order_relaxed);
    job_ = &job;
    // Every worker acknowledges every job (those without a part too), so none can still be reading the
    // previous job when the next one is published.
    remaining_.store(int(workers_->size()), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(sleep_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    inside_ = true;
    if (job.piece) {
      take_pieces(job);
    } else {
      body(begin, std::min(end, begin + chunk));
    }
    inside_ = false;
    while (remaining_.load(std::memory_order_acquire) != 0) _mm_pause_portable();
  }

 private:
  struct Job {
    void (*call)(const void*, int64_t, int64_t);
    const void* ctx;
    int64_t begin, end, chunk, parts;
    int64_t piece;  // > 0: every thread takes pieces of this many from next_ until none is left
  };

  void take_pieces(const Job& job) {
    while (true) {
      const int64_t b = next_.fetch_add(job.piece, std::memory_order_relaxed);
      if (b >= job.end) return;
      job.call(job.ctx, b, std::min(job.end, b + job.piece));
    }
  }

  static inline void _mm_pause_portable() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  void ensure_workers(int wanted) {
    if (pid_ != getpid()) {  // a forked child has none of its parent's threads: start over (leak the old handles)
      workers_ = new std::vector<std::thread>();
      stop_ = false;
      pid_ = getpid();
    }
    if (int(workers_->size()) == wanted) return;
    stop_workers();
    // A worker starts from the generation current now: the job published next is its first.
    const uint64_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; i < wanted; ++i) workers_->emplace_back([this, i, now] { work(i + 1, now); });
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(sleep_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& worker : *workers_) worker.join();
    workers_->clear();
    stop_ = false;
  }

  void work(int index, uint64_t seen) {
    inside_ = true;
    while (true) {
      const auto started = std::chrono::steady_clock::now();
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        // Spin through the gaps between one step's kernels; yield the core after a moment (torch's own
        // threads may need it) and sleep once the step is over.
        if (++spins < 2000) {
          _mm_pause_portable();
          continue;
        }
        if (std::chrono::steady_clock::now() - started < std::chrono::microseconds(500)) {
          sched_yield();
          continue;
        }
        std::unique_lock<std::mutex> lock(sleep_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      const Job& job = *job_;
      const int64_t b = job.begin + index * job.chunk;
      if (job.piece) {
        if (index < job.parts) take_pieces(job);
      } else if (index < job.parts && b < job.end) {
        job.call(job.ctx, b, std::min(job.end, b + job.chunk));
      }
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::vector<std::thread>* workers_ = new std::vector<std::thread>();
  pid_t pid_ = getpid();
  std::mutex busy_, sleep_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<int64_t> next_{0};
  const Job* job_ = nullptr;
  bool stop_ = false;
  static thread_local bool inside_;
};

thread_local bool SpinPool::inside_ = false;

template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& body) {
  SpinPool::instance().run(begin, end, grain, body);
}

template <class F>
inline void parallel_for_pieces(int64_t begin, int64_t end, int64_t grain, int64_t piece, const F& body) {
  SpinPool::instance().run(begin, end, grain, body, piece);
}


constexpr int64_t kBlock = 32;  // weights per quantization block, and activations per activation scale
// Activation rows that share each float weight vector loaded: 4 x 6 accumulators fit AVX-512's 32 registers.
#if defined(GYM_AVX512)
constexpr int kMaxRows = 6;
#else
constexpr int kMaxRows = 4;
#endif

inline float half_to_float(uint16_t h) {
#ifdef GYM_AVX2
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (h & 0x8000u) << 16;
  int32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      exponent = 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      bits = sign | (uint32_t(exponent + 112) << 23) | (mantissa << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | (uint32_t(exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
#endif
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

enum class WeightKind { F32, BF16, F16 };

template <WeightKind kind>
inline float weight_at(const void* w, int64_t i) {
  if constexpr (kind == WeightKind::F32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (kind == WeightKind::BF16) {
    return bf16_to_float(static_cast<const uint16_t*>(w)[i]);
  } else {
    return half_to_float(static_cast<const uint16_t*>(w)[i]);
  }
}

#ifdef GYM_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x for 8 floats, within ~2 ulp of std::exp over the float range (Cephes' expf: x = n ln2 + r with |r| <=
// ln2 / 2, a degree-7 polynomial in r, then 2^n through the exponent bits). A decode step computes ~700,000
// exponentials at 16 rows (silu and the attention softmax), and libm's scalar expf was ~5% of the step. Below
// the smallest normal float's logarithm it gives 0, as expf nearly does: so e^-inf, a token a grammar forbids in
// the sampling softmax, is 0, not that float.
inline __m256 exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365447504f), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.3365447504f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
}

template <WeightKind kind>
inline __m256 load8(const void* w, int64_t i) {
  if constexpr (kind == WeightKind::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else if constexpr (kind == WeightKind::BF16) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
  }
}

// The 8-bit dot product of 32 pairs as 8 int32 partial sums, for |a| (unsigned) and b * sign(a) (signed),
// a and b one operand each: the instructions multiply unsigned by signed bytes, so the caller moves the sign
// of one operand onto the other first. |x| <= 127 and |w| <= 127 keep the int16 pair sums of maddubs from
// saturating.
inline __m256i dot_u8s8(__m256i ax, __m256i sw) {
#if defined(GYM_VNNI512)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sw);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sw), _mm256_set1_epi16(1));
#endif
}

#endif

// What a kernel reads next, fetched a few cache lines per step of what it computes now: the next weight group
// or tile while this one computes, the next kv head's positions while this one attends. The hardware's own
// prefetchers stop at every 4 KB page and follow demand only a few lines ahead, and a kernel's demand comes in
// bursts: a group's rows take it kGroupRows at a time, and only the first pass reads its weights from memory
// (a 16-row int8 step read its weights at ~5 GB/s in all, yet its layers ran 1.4x slower than with the weights
// in L2) while the later passes, computing from L1, fetched nothing. Spread over every step of the current
// work, the next work's lines arrive before they are wanted. Measured on the embedded model with the AVX2
// variant, alternating with and without in one process: int8 16-row layers 1.2x and one-row 1.4x faster,
// float32 steps 1.04x (one row) and 1.13x (16 rows), 16-row attention 1.3x. Prefetches never fault and change no
// number.
struct Ahead {
  const uint8_t* next = nullptr;
  const uint8_t* end = nullptr;
  int64_t lines_per_step = 0;
  inline void step() {
    for (int64_t i = 0; i < lines_per_step && next < end; ++i, next += 64) __builtin_prefetch(next, 0, 2);
  }
};

// The tile of weight rows after [n, n + T) (up to row `end`), fetched over a tile's K / 8 steps.
inline Ahead next_tile(const void* weights, int64_t n, int64_t T, int64_t end, int64_t bytes_per_row, int64_t K) {
  const auto* next = static_cast<const uint8_t*>(weights) + (n + T) * bytes_per_row;
  const int64_t bytes = (std::min(end, n + 2 * T) - n - T) * bytes_per_row;
  return Ahead{next, next + bytes, (bytes / 64 + K / 8) / std::max<int64_t>(1, K / 8)};
}

// Weights per panel of the many-row float products (linear_float_wide, linear_float_panels): half an L2.
constexpr int64_t kPanelBytes = int64_t(1) << 20;

// out[t * R + r] = dot(x[r], w[t]) for R activation rows and T weight rows: every weight vector loaded
// feeds R rows, every activation vector feeds T weight rows, and R and T are compile-time constants
// so the accumulators live in registers.
//
// Batch invariance: each product is summed the same way whatever R and T are (eight lanes, k in order,
// then the same horizontal sum and the same scalar tail), so a row's numbers do not depend on how many
// rows share the call, and a greedy answer does not change with the load. A 512-bit loop for many rows
// was 1.1-1.35x faster at 8-16 rows on AVX-512, but it sums in sixteen lanes: the same request answered
// differently alone and in a batch, so it is gone.
template <WeightKind kind, int R, int T>
void dot_float(const float* x, int64_t ldx, const void* w, int64_t ldw, int64_t K, float* out, Ahead ahead = {}) {
  constexpr int64_t elem = kind == WeightKind::F32 ? 4 : 2;
  const char* wb = static_cast<const char*>(w);
  int64_t k = 0;
  float sums[T * R] = {};
#ifdef GYM_AVX2
  __m256 acc[T * R];
  for (int i = 0; i < T * R; ++i) acc[i] = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    ahead.step();
    __m256 wv[T];
    for (int t = 0; t < T; ++t) wv[t] = load8<kind>(wb + t * ldw * elem, k);
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
      // In a register, loaded once: GCC otherwise folds the load into each of the T multiply-adds (a memory
      // operand). At a prompt's 6 x 2 tiles that was 14 loads per 12 multiply-adds, more than two load ports
      // serve in the 6 cycles the multiply-adds take; pinned, 8. The embedded model's four prompt products at
      // 1,024 rows on AVX2 went 46.7 -> 41.5 ms (6 alternating processes, AMD EPYC Zen 4, GYM_KERNEL_ISA=avx2).
      asm("" : "+v"(xv));
      for (int t = 0; t < T; ++t) acc[t * R + r] = _mm256_fmadd_ps(wv[t], xv, acc[t * R + r]);
    }
  }
  for (int i = 0; i < T * R; ++i) sums[i] = hsum(acc[i]);
#endif
  for (; k < K; ++k) {
    for (int t = 0; t < T; ++t) {
      const float wk = weight_at<kind>(wb + t * ldw * elem, k);
      for (int r = 0; r < R; ++r) sums[t * R + r] += wk * x[r * ldx + k];
    }
  }
  for (int i = 0; i < T * R; ++i) out[i] = sums[i];
}

// The same for quantized weights, stored in groups of kGroup = 16 output rows laid out for a dot product
// whose vector lanes are the group's 16 outputs: per group and block of 32 inputs, the inputs in eight
// quads of 4, and per quad the 16 rows' 4 weights side by side ([N / 16][K / 32][8 quads][16][4] bytes for
// int8). One 64-byte vector then holds 4 inputs of 16 outputs, and a broadcast of 4 activation bytes
// multiplies all of it in one instruction (vpdpbusd), accumulating straight into the 16 outputs: no
// horizontal sums, and the per-block float work (convert, scale) is done once for 16 outputs instead of
// once per output. int4 packs that block into 4 vectors of 64 bytes, quad c in the low nibbles of vector c
// and quad c + 4 in its high nibbles. The float16 parameters are per group and block: the 16 rows' scales
// ([N / 16][K / 32][16]) for int8; the 16 steps d then the 16 minimums m ([N / 16][K / 32][2][16]) for int4,
// w = d * q + m with q in 0..15. xq/xs are the activations as int8 with one float scale per block, xsum each
// block's sum of xq and xm = xs * xsum, which carries the int4 minimum: sum(x (d q + m)) = d sum(x q) + m sum(x).
// Measured on the embedded model's shapes (K=576, N=3072), against the 4-row tiles with horizontal sums
// this replaced: 2-3x faster with AVX512-VNNI at 1 to 16 rows, 1.3-1.4x (int8) and 1.7-2x (int4) with AVX2.
constexpr int64_t kGroup = 16;

#if defined(GYM_VNNI512)
constexpr int kGroupRows = 8;  // 8 accumulators + the block's 8 weight vectors fit the 32 registers
#else
constexpr int kGroupRows = 4;
#endif

inline int32_t load_quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}


// out[r * ldo + o] = sum_k x[r, k] w[o, k] for the 16 outputs o of one group and R activation rows.
template <bool int4, int R>
void dot_group(const int8_t* xq, const float* xs, const int32_t* xsum, const float* xm, int64_t K,
               const uint8_t* w, const uint16_t* ws, float* out, int64_t ldo, Ahead ahead = {}) {
  const int64_t blocks = K / kBlock;
  constexpr int64_t block_bytes = int4 ? kBlock * kGroup / 2 : kBlock * kGroup;
  constexpr int64_t params = int4 ? 2 * kGroup : kGroup;
#if defined(GYM_VNNI512)
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  // vpdpbusd multiplies unsigned by signed bytes: int8 weights go in with their sign bit flipped (w + 128),
  // and each block's 128 * sum(xq) comes off the integer sum again.
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t j = 0; j < blocks; ++j) {
      ahead.step();
    const uint8_t* p = w + j * block_bytes;
    __m512i wv[8];
    if constexpr (int4) {
      for (int c = 0; c < 4; ++c) {
        const __m512i raw = _mm512_loadu_si512(p + c * 64);
        wv[c] = _mm512_and_si512(raw, low4);
        wv[c + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      }
    } else {
      for (int q = 0; q < 8; ++q) wv[q] = _mm512_xor_si512(_mm512_loadu_si512(p + q * 64), flip);
    }
    const __m512 wscale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + j * params)));
    __m512 wmin = _mm512_setzero_ps();
    if constexpr (int4)
      wmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + j * params + kGroup)));
    for (int r = 0; r < R; ++r) {
      const int8_t* xb = xq + r * K + j * kBlock;
      __m512i d = _mm512_setzero_si512();
      for (int q = 0; q < 8; ++q) d = _mm512_dpbusd_epi32(d, wv[q], _mm512_set1_epi32(load_quad(xb + q * 4)));
      if constexpr (!int4) d = _mm512_sub_epi32(d, _mm512_set1_epi32(128 * xsum[r * blocks + j]));
      const __m512 scale = _mm512_mul_ps(wscale, _mm512_set1_ps(xs[r * blocks + j]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, acc[r]);
      if constexpr (int4) acc[r] = _mm512_fmadd_ps(wmin, _mm512_set1_ps(xm[r * blocks + j]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
#elif defined(GYM_AVX2)
  // 256-bit vectors hold 8 outputs: the group's two halves one after the other.
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < blocks; ++j) {
      ahead.step();
      const uint8_t* p = w + j * block_bytes + h * 32;
      __m256i d[R];
      for (int r = 0; r < R; ++r) d[r] = _mm256_setzero_si256();
      for (int q = 0; q < 8; ++q) {
        __m256i wq;
        if constexpr (int4) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + (q & 3) * 64));
          wq = q < 4 ? _mm256_and_si256(raw, low4) : _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        } else {
          wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + q * 64));
        }
        // int8: |w| once per weight vector, for all R rows; each row then moves the sign of w onto its x. Taking
        // |x| and moving its sign onto w instead costs one more instruction per row (16 rows 1.1x slower).
        const __m256i wa = int4 ? wq : _mm256_sign_epi8(wq, wq);
        for (int r = 0; r < R; ++r) {
          const __m256i xb = _mm256_set1_epi32(load_quad(xq + r * K + j * kBlock + q * 4));
          if constexpr (int4) {
            // Codes <= 15 and |x| <= 127: a pair sums to at most 3,810, so eight quads stay within int16.
            d[r] = _mm256_add_epi16(d[r], _mm256_maddubs_epi16(wq, xb));
          } else {
            d[r] = _mm256_add_epi32(d[r], dot_u8s8(wa, _mm256_sign_epi8(xb, wq)));
          }
        }
      }
      const uint16_t* wp = ws + j * params + h * 8;
      const __m256 wscale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp)));
      for (int r = 0; r < R; ++r) {
        const __m256i dots = int4 ? _mm256_madd_epi16(d[r], ones) : d[r];
        const __m256 scale = _mm256_mul_ps(wscale, _mm256_set1_ps(xs[r * blocks + j]));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), scale, acc[r]);
        if constexpr (int4) {
          const __m256 wmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + kGroup)));
          acc[r] = _mm256_fmadd_ps(wmin, _mm256_set1_ps(xm[r * blocks + j]), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * ldo + h * 8, acc[r]);
  }
#else
  for (int r = 0; r < R; ++r)
    for (int64_t o = 0; o < kGroup; ++o) out[r * ldo + o] = 0.f;
  for (int64_t j = 0; j < blocks; ++j) {
      ahead.step();
    const uint8_t* p = w + j * block_bytes;
    for (int64_t o = 0; o < kGroup; ++o) {
      const float wscale = half_to_float(ws[j * params + o]);
      for (int r = 0; r < R; ++r) {
        int32_t dot = 0;
        for (int q = 0; q < 8; ++q) {
          for (int b = 0; b < 4; ++b) {
            const int32_t code = int4 ? int32_t((p[(q & 3) * 64 + o * 4 + b] >> (q < 4 ? 0 : 4)) & 0x0f)
                                      : int32_t(int8_t(p[q * 64 + o * 4 + b]));
            dot += code * int32_t(xq[r * K + j * kBlock + q * 4 + b]);
          }
        }
        out[r * ldo + o] += float(dot) * wscale * xs[r * blocks + j];
        if constexpr (int4) out[r * ldo + o] += half_to_float(ws[j * params + kGroup + o]) * xm[r * blocks + j];
      }
    }
  }
#endif
}

void check_input(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "gym kernels take a contiguous 2-D float32 CPU activation");
  TORCH_CHECK(x.size(1) == K, "activation width ", x.size(1), " does not match the weight's ", K);
}

// Float weight rows whose products share each activation vector loaded. AVX2 has 16 vector registers: 4
// activation rows x 3 weight rows of accumulators, 3 weight vectors and an activation vector fill them exactly,
// where 4 x 4 spilled (1,024-token prefill products 1.2x faster). AVX-512 has 32: 6 x 4 of them.
#if defined(GYM_AVX512)
constexpr int kTile = 4;
#else
constexpr int kTile = 3;
#endif

// Activation rows per block: a prompt's rows are taken a block at a time, each block's rows staying in L2
// (256 KB of them) while every weight tile of the thread's range passes over them. Without it the rows of a
// 1,024-token prefill (2.4 MB at K = 576) were read from L3 for every tile: 80 instead of 117 GFLOP/s.
inline int64_t row_block(int64_t row_bytes, int64_t multiple) {
  const int64_t rows = (int64_t(256) << 10) / std::max<int64_t>(1, row_bytes);
  return std::max<int64_t>(multiple, rows / multiple * multiple);
}

// Weights per piece of a decode step's float product. A product split in fixed halves ends when the slower
// thread does, and on two cores shared with the engine's other threads one often starts late or is
// interrupted: the faster thread spun ~8% of a one-row float32 step waiting (perf, AMD EPYC, AVX2). Pieces
// taken in turn from a shared counter even that out. Measured on the embedded model's one-row float32 decode
// step, 8 alternating processes each against the fixed halves: 256 KB pieces 1.03x faster on average (faster
// in 6 of 8); 64 KB pieces were slower in 3 of 3 (each piece's first tile is not fetched ahead, and the two
// threads' streams interleave finely). Each thread gets at least four pieces of at least kMinPieceBytes, so that
// the last piece taken costs little against the whole: a product too small for that (576 x 576 floats on 16
// threads) keeps the fixed ranges.
constexpr int64_t kPieceBytes = int64_t(256) << 10;
constexpr int64_t kMinPieceBytes = int64_t(128) << 10;

// Tiles per piece of a decode step's product of `weight_bytes` (0: fixed ranges).
inline int64_t piece_tiles(int64_t weight_bytes, int64_t tile_bytes) {
  const int64_t share = weight_bytes / (4 * std::max(1, at::get_num_threads()));
  if (share < kMinPieceBytes) return 0;
  return std::max<int64_t>(1, std::min(kPieceBytes, share) / std::max<int64_t>(1, tile_bytes));
}

// Each thread takes a range of output features (for a decode step's few rows, pieces in turn), kTile at a
// time; within a tile, groups of up to kMaxRows activation rows share every weight vector loaded.
// `tile(R, T, n, b)` computes rows b..b+R of outputs n..n+T. One row too takes kTile weight rows at a time: one
// weight row at a time (one sum in flight, a chain of dependent multiply-adds) read at 77-79% of the read probe,
// kTile at a time at 83-96%.
// Every product is computed by the same code whatever the tile, so the grouping never changes a number.
template <typename Tile>
void for_each_tile(int64_t B, int64_t N, int64_t K, int64_t bytes_per_row, const void* weights, Tile tile) {
  const int64_t grain = std::max<int64_t>(kTile, (int64_t(1) << 16) / std::max<int64_t>(1, bytes_per_row));
  const int64_t block = row_block(K * int64_t(sizeof(float)), kMaxRows);
  // A decode step's few rows: the threads take the tiles a piece at a time (see kPieceBytes).
  const int64_t piece = B <= kMaxRows ? piece_tiles(N * bytes_per_row, kTile * bytes_per_row) : 0;
  parallel_for_pieces(0, (N + kTile - 1) / kTile, (grain + kTile - 1) / kTile, piece, [&](int64_t t0, int64_t t1) {
    for (int64_t b0 = 0; b0 < B; b0 += block) {
      const int64_t b1 = std::min(B, b0 + block);
      const int64_t n_end = std::min(N, t1 * kTile);
      for (int64_t n = t0 * kTile; n < n_end; n += kTile) {
        const bool full = n + kTile <= N;
        for (int64_t b = b0; b < b1; b += kMaxRows) {
          const int64_t rows = std::min<int64_t>(kMaxRows, b1 - b);
          // The first rows' pass over a tile fetches the next tile's weights (the later passes find this
          // tile's in the cache).
          Ahead ahead;
          if (b == b0 && n + kTile < n_end) ahead = next_tile(weights, n, kTile, n_end, bytes_per_row, K);
          if (!full) {
            for (int64_t m = n; m < std::min(N, n + kTile); ++m) {
              switch (rows) {
                case 1: tile(std::integral_constant<int, 1>{}, std::integral_constant<int, 1>{}, m, b, Ahead{}); break;
                case 2: tile(std::integral_constant<int, 2>{}, std::integral_constant<int, 1>{}, m, b, Ahead{}); break;
                case 3: tile(std::integral_constant<int, 3>{}, std::integral_constant<int, 1>{}, m, b, Ahead{}); break;
#if defined(GYM_AVX512)
                case 4: tile(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{}, m, b, Ahead{}); break;
                case 5: tile(std::integral_constant<int, 5>{}, std::integral_constant<int, 1>{}, m, b, Ahead{}); break;
                default: tile(std::integral_constant<int, 6>{}, std::integral_constant<int, 1>{}, m, b, Ahead{}); break;
#else
                default: tile(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{}, m, b, Ahead{}); break;
#endif
              }
            }
            continue;
          }
          switch (rows) {
            case 1: tile(std::integral_constant<int, 1>{}, std::integral_constant<int, kTile>{}, n, b, ahead); break;
            case 2: tile(std::integral_constant<int, 2>{}, std::integral_constant<int, kTile>{}, n, b, ahead); break;
            case 3: tile(std::integral_constant<int, 3>{}, std::integral_constant<int, kTile>{}, n, b, ahead); break;
#if defined(GYM_AVX512)
            case 4: tile(std::integral_constant<int, 4>{}, std::integral_constant<int, kTile>{}, n, b, ahead); break;
            case 5: tile(std::integral_constant<int, 5>{}, std::integral_constant<int, kTile>{}, n, b, ahead); break;
            default: tile(std::integral_constant<int, 6>{}, std::integral_constant<int, kTile>{}, n, b, ahead); break;
#else
            default: tile(std::integral_constant<int, 4>{}, std::integral_constant<int, kTile>{}, n, b, ahead); break;
#endif
          }
        }
      }
    }
  });
}

#if defined(GYM_AVX512)
// Many activation rows with float weights (a prompt's chunk), on AVX-512: twice the work per instruction, and
// the same numbers as dot_float to the bit. dot_float sums each product in eight lanes, k in order; here one
// 512-bit register holds two rows' eight lanes, its weight vector the same eight weights twice, so each half
// is exactly dot_float's chain, and the halves get dot_float's horizontal sum and scalar tail. The rows are
// packed in pairs ([pair][K / 8][row 0's 8, row 1's 8]) so a pair is one load. A prompt's tokens therefore
// give the same keys, values and logits whether they were prefilled together, one by one, or decoded, and a
// cached prefix is the prefix the prompt would have computed.
//
// The loops are blocked for the caches: a thread's weights go a panel at a time (kPanelBytes, kept in L2),
// every group of P pairs passes over the whole panel (the group's rows stay in L1), so each weight vector
// loaded from L2 feeds 2P rows and each activation vector feeds T weight rows.
constexpr int kWidePairs = 4;
constexpr int kWideTile = 6;  // 4 x 6 accumulators, 6 weight vectors and an activation vector: 31 registers

template <WeightKind kind>
inline __m512 load8_twice(const void* w, int64_t k) {
  return _mm512_maskz_broadcast_f32x8(0xffff, load8<kind>(w, k));  // float32: one load that broadcasts
}

// out[t * ldo + r] for the 2P rows of P packed pairs (only `rows` of them real) and T weight rows.
template <WeightKind kind, int P, int T>
void dot_float_pairs(const float* pairs, int64_t ld_pair, const float* x, int64_t ldx, int rows, const void* w,
                     int64_t ldw, int64_t K, float* out, int64_t ldo, Ahead ahead) {
  constexpr int64_t elem = kind == WeightKind::F32 ? 4 : 2;
  const char* wb = static_cast<const char*>(w);
  const int64_t K8 = K / 8 * 8;
  __m512 acc[T * P];
  for (int i = 0; i < T * P; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    ahead.step();
    __m512 wv[T];
    for (int t = 0; t < T; ++t) wv[t] = load8_twice<kind>(wb + t * ldw * elem, k);
    for (int p = 0; p < P; ++p) {
      const __m512 xv = _mm512_loadu_ps(pairs + p * ld_pair + 2 * k);
      for (int t = 0; t < T; ++t) acc[t * P + p] = _mm512_fmadd_ps(wv[t], xv, acc[t * P + p]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < rows; ++r) {
      const __m512 a = acc[t * P + r / 2];
      float sum = hsum(r % 2 == 0 ? _mm512_castps512_ps256(a) : _mm512_maskz_extractf32x8_ps(0xff, a, 1));
      for (int64_t k = K8; k < K; ++k) sum += weight_at<kind>(wb + t * ldw * elem, k) * x[r * ldx + k];
      out[t * ldo + r] = sum;
    }
  }
}

// Where the pair kernel beats dot_float's tiles, measured on the embedded model's decode steps (weights from
// memory, ms per step, float32) and its 256-row prefill chunks: at 7-8 rows it takes them in one pass where the
// tiles take two (8 rows 30.0 against 34.8 ms); at 9-24 rows the tiles' passes over one tile in L1 win (16 rows
// 52.8 against 50.9 ms); from 32 rows up the pairs' compute wins (32 rows 91.3 against 94.1 ms; a 1,024-token
// prefill's products 1.19 against 1.41 s).
inline bool wide_rows(int64_t B) { return B >= 32 || (B > kMaxRows && B <= 2 * kWidePairs); }

// y = x w^T for B rows by the pair kernel (see dot_float_pairs).
template <WeightKind kind>
void linear_float_wide(const float* x, int64_t B, const void* w, int64_t N, int64_t K, float* y) {
  constexpr int64_t elem = kind == WeightKind::F32 ? 4 : 2;
  constexpr int P = kWidePairs, T = kWideTile;
  const int64_t K8 = K / 8 * 8, n_pairs = (B + 1) / 2, ld_pair = 2 * K8;
  // The caller's thread packs; its buffer is kept, so a prompt's chunks do not fault fresh pages in each time.
  // A lone last row's pair half is never read back.
  thread_local std::vector<float> packed;
  if (packed.size() < size_t(n_pairs * ld_pair)) packed.resize(size_t(n_pairs * ld_pair));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < K8; j += 8)
      std::memcpy(packed.data() + (b / 2) * ld_pair + 2 * j + (b % 2) * 8, x + b * K + j, 8 * sizeof(float));
  const int64_t row_bytes = K * elem;
  const int64_t tiles = (N + T - 1) / T;
  const int64_t panel = std::max<int64_t>(1, kPanelBytes / (T * row_bytes));
  const char* wb = static_cast<const char*>(w);
  const float* all_pairs = packed.data();  // named here: inside the workers, `packed` would be their own
  parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    float part[T * 2 * P];
    for (int64_t p0 = t0; p0 < t1; p0 += panel) {
      const int64_t p1 = std::min(t1, p0 + panel);
      for (int64_t g = 0; g < n_pairs; g += P) {
        const int64_t b = 2 * g;
        const int rows = int(std::min<int64_t>(2 * P, B - b));
        const float* gp = all_pairs + g * ld_pair;
        for (int64_t tile = p0; tile < p1; ++tile) {
          const int64_t n = tile * T;
          // The first group's pass over the panel reads it from memory: it fetches the next tile meanwhile.
          Ahead ahead;
          if (g == 0 && tile + 1 < p1) ahead = next_tile(wb, n, T, N, row_bytes, K);
          const auto run = [&](auto pairs_tag, auto tiles_tag, int64_t first, int count) {
            constexpr int PP = decltype(pairs_tag)::value, TT = decltype(tiles_tag)::value;
            dot_float_pairs<kind, PP, TT>(gp, ld_pair, x + b * K, K, rows, wb + first * row_bytes, K, K, part,
                                          2 * P, ahead);
            for (int t = 0; t < count; ++t)
              for (int r = 0; r < rows; ++r) y[(b + r) * N + first + t] = part[t * 2 * P + r];
          };
          const auto by_pairs = [&](auto tiles_tag, int64_t first, int count) {
            switch ((rows + 1) / 2) {
              case 1: run(std::integral_constant<int, 1>{}, tiles_tag, first, count); break;
              case 2: run(std::integral_constant<int, 2>{}, tiles_tag, first, count); break;
              case 3: run(std::integral_constant<int, 3>{}, tiles_tag, first, count); break;
              case 4: run(std::integral_constant<int, 4>{}, tiles_tag, first, count); break;
              default: run(std::integral_constant<int, P>{}, tiles_tag, first, count); break;
            }
          };
          if (n + T <= N) {
            by_pairs(std::integral_constant<int, T>{}, n, T);
          } else {
            for (int64_t m = n; m < N; ++m) by_pairs(std::integral_constant<int, 1>{}, m, 1);
          }
        }
      }
    }
  });
}
#endif

#if defined(GYM_AVX2) && !defined(GYM_AVX512)
// A prompt's chunk on AVX2: the loops of linear_float_wide around dot_float's products (a thread's weights a
// panel at a time in L2, each group of kPanelRows rows passing over the whole panel from L1), where for_each_tile
// keeps a tile in L1 and passes the rows over it from L2. The same products, so the same numbers.
//
// The tile is 6 rows x 2 weight rows, not the decode step's 4 x 3: both fill AVX2's 16 registers (12
// accumulators, the weight vectors and one activation vector), but per 12 multiply-adds 6 x 2 loads 2 weight
// vectors from L2 and 6 activation vectors from L1 where 4 x 3 loads 3 and 4, and the weights' stream from L2 is
// what held the products back. Measured on the embedded model's four prefill shapes at 256 rows (a one-off
// script, the two tiles alternating in one process, AMD EPYC Zen 3, AVX2): 111 -> 127 and 94 -> 114 GFLOP/s
// (medians of 8 and 10 rounds) on two threads, 57.6 -> 60.9 on one; 5 x 2 was slower than both (108.2 and 93.6 on
// two threads, 50.4 on one).
constexpr int kPanelRows = 6;
constexpr int kPanelTile = 2;

template <WeightKind kind>
void linear_float_panels(const float* x, int64_t B, const void* w, int64_t N, int64_t K, float* y) {
  constexpr int64_t elem = kind == WeightKind::F32 ? 4 : 2;
  constexpr int T = kPanelTile;
  const int64_t row_bytes = K * elem, tiles = (N + T - 1) / T;
  const int64_t panel = std::max<int64_t>(1, kPanelBytes / (T * row_bytes));
  const char* wb = static_cast<const char*>(w);
  parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    float part[T * kPanelRows];
    for (int64_t p0 = t0; p0 < t1; p0 += panel) {
      const int64_t p1 = std::min(t1, p0 + panel);
      for (int64_t b = 0; b < B; b += kPanelRows) {
        const int rows = int(std::min<int64_t>(kPanelRows, B - b));
        for (int64_t tile = p0; tile < p1; ++tile) {
          const int64_t n = tile * T;
          Ahead ahead;
          if (b == 0 && tile + 1 < p1) ahead = next_tile(wb, n, T, N, row_bytes, K);
          const auto run = [&](auto rows_tag, auto tiles_tag, int64_t first) {
            constexpr int R = decltype(rows_tag)::value, TT = decltype(tiles_tag)::value;
            dot_float<kind, R, TT>(x + b * K, K, wb + first * row_bytes, K, K, part, ahead);
            for (int t = 0; t < TT; ++t)
              for (int r = 0; r < R; ++r) y[(b + r) * N + first + t] = part[t * R + r];
          };
          const auto by_rows = [&](auto tiles_tag, int64_t first) {
            switch (rows) {
              case 1: run(std::integral_constant<int, 1>{}, tiles_tag, first); break;
              case 2: run(std::integral_constant<int, 2>{}, tiles_tag, first); break;
              case 3: run(std::integral_constant<int, 3>{}, tiles_tag, first); break;
              case 4: run(std::integral_constant<int, 4>{}, tiles_tag, first); break;
              case 5: run(std::integral_constant<int, 5>{}, tiles_tag, first); break;
              default: run(std::integral_constant<int, kPanelRows>{}, tiles_tag, first); break;
            }
          };
          if (n + T <= N) {
            by_rows(std::integral_constant<int, T>{}, n);
          } else {
            for (int64_t m = n; m < N; ++m) by_rows(std::integral_constant<int, 1>{}, m);
          }
        }
      }
    }
  });
}
#endif

at::Tensor linear_float(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu(), "weight must be a contiguous 2-D CPU tensor");
  const int64_t B = x.size(0), N = w.size(0), K = w.size(1);
  check_input(x, K);
  at::Tensor y = at::empty({B, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto run = [&](auto kind_tag, const void* wp, int64_t elem) {
    constexpr WeightKind kind = decltype(kind_tag)::value;
#if defined(GYM_AVX512)
    if (wide_rows(B)) {
      linear_float_wide<kind>(xp, B, wp, N, K, yp);
      return;
    }
#elif defined(GYM_AVX2)
    if (B >= 32) {  // measured at 256 rows: 1.06-1.12x on the embedded model's four shapes
      linear_float_panels<kind>(xp, B, wp, N, K, yp);
      return;
    }
#endif
    for_each_tile(B, N, K, K * elem, wp, [&](auto rows, auto tiles, int64_t n, int64_t b, Ahead ahead) {
      constexpr int R = decltype(rows)::value, T = decltype(tiles)::value;
      float part[R * T];
      dot_float<kind, R, T>(xp + b * K, K, static_cast<const char*>(wp) + n * K * elem, K, K, part, ahead);
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < R; ++r) yp[(b + r) * N + n + t] = part[t * R + r];
    });
  };
  switch (w.scalar_type()) {
    case at::kFloat:
      run(std::integral_constant<WeightKind, WeightKind::F32>{}, w.data_ptr(), 4);
      break;
    case at::kBFloat16:
      run(std::integral_constant<WeightKind, WeightKind::BF16>{}, w.data_ptr(), 2);
      break;
    case at::kHalf:
      run(std::integral_constant<WeightKind, WeightKind::F16>{}, w.data_ptr(), 2);
      break;
    default:
      TORCH_CHECK(false, "gym linear: weight dtype must be float32, bfloat16 or float16");
  }
  return y;
}

// Symmetric per-block int8 quantization of the activations (scale = max|x| / 127), each block's sum of
// the quantized values, and that sum as a float (xs * sum).
void quantize_rows(const float* x, int64_t B, int64_t K, int8_t* xq, float* xs, int32_t* xsum, float* xm) {
  const int64_t blocks = K / kBlock;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < blocks; ++j) {
      const float* src = x + b * K + j * kBlock;
      int8_t* dst = xq + b * K + j * kBlock;
#ifdef GYM_AVX2
      // The same numbers as the scalar loop below: cvtps rounds to nearest even, as nearbyint does.
      __m256 v[4];
      __m256 top = _mm256_setzero_ps();
      const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(src + 8 * i);
        top = _mm256_max_ps(top, _mm256_and_ps(v[i], magnitude));
      }
      __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
      m = _mm_max_ps(m, _mm_movehl_ps(m, m));
      m = _mm_max_ss(m, _mm_movehdup_ps(m));
      const float scale = _mm_cvtss_f32(m) / 127.f;
      const __m256 inv = _mm256_set1_ps(scale > 0.f ? 1.f / scale : 0.f);
      __m256i q[4];
      __m256i sum = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) {
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
        sum = _mm256_add_epi32(sum, q[i]);
      }
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                          _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      alignas(32) int32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
      int32_t total = 0;
      for (int i = 0; i < 8; ++i) total += lanes[i];
#else
      float amax = 0.f;
      for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float scale = amax / 127.f;
      const float inv = scale > 0.f ? 1.f / scale : 0.f;
      int32_t total = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        dst[i] = static_cast<int8_t>(std::nearbyint(src[i] * inv));
        total += dst[i];
      }
#endif
      xs[b * blocks + j] = scale;
      xsum[b * blocks + j] = total;
      xm[b * blocks + j] = scale * float(total);
    }
  }
}

template <bool int4>
at::Tensor linear_quant(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws) {
  TORCH_CHECK(wq.dim() == 2 && wq.is_contiguous() && wq.device().is_cpu(), "packed weight must be contiguous 2-D");
  TORCH_CHECK(ws.dim() == 2 && ws.is_contiguous() && ws.scalar_type() == at::kHalf, "scales must be float16 [N, K/32]");
  const int64_t B = x.size(0), N = wq.size(0);
  const int64_t K = int4 ? wq.size(1) * 2 : wq.size(1);
  TORCH_CHECK(K % kBlock == 0 && N % kGroup == 0, "quantized weights need K % 32 == 0 and N % 16 == 0");
  constexpr int64_t params = int4 ? 2 : 1;  // int4 blocks carry a minimum beside their step
  const int64_t blocks = K / kBlock;
  TORCH_CHECK(ws.size(0) == N && ws.size(1) == params * blocks, "scales shape does not match the packed weight");
  check_input(x, K);
  std::vector<int8_t> xq(B * K);
  std::vector<float> xs(B * blocks), xm(B * blocks);
  std::vector<int32_t> xsum(B * blocks);
  quantize_rows(x.data_ptr<float>(), B, K, xq.data(), xs.data(), xsum.data(), xm.data());
  at::Tensor y = at::empty({B, N}, x.options());
  float* yp = y.data_ptr<float>();
  const auto* wp = static_cast<const uint8_t*>(wq.data_ptr());
  const auto* sp = static_cast<const uint16_t*>(ws.data_ptr());
  const int64_t group_bytes = kGroup * wq.size(1), group_params = params * blocks * kGroup;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / group_bytes);
  const int64_t block = row_block(K, kGroupRows);  // the int8 rows a block of the prompt keeps in L2
  parallel_for(0, N / kGroup, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t b0 = 0; b0 < B; b0 += block)
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* w = wp + g * group_bytes;
      const uint16_t* s = sp + g * group_params;
      const int64_t b_end = std::min(B, b0 + block), passes = (b_end - b0 + kGroupRows - 1) / kGroupRows;
      // Each pass's steps: one per block, twice over with AVX2 (a group's two halves of eight outputs).
#if defined(GYM_AVX2) && !defined(GYM_VNNI512)
      const int64_t steps = 2 * blocks;
#else
      const int64_t steps = blocks;
#endif
      const int64_t lines = g + 1 < g1 ? group_bytes / 64 : 0;
      for (int64_t b = b0; b < b_end; b += kGroupRows) {
        const int64_t pass = (b - b0) / kGroupRows;
        const int64_t first = lines * pass / passes, last = lines * (pass + 1) / passes;
        const Ahead ahead{w + group_bytes + 64 * first, w + group_bytes + 64 * last, (last - first + steps - 1) / steps};
        const int8_t* xr = xq.data() + b * K;
        const float* sr = xs.data() + b * blocks;
        const int32_t* tr = xsum.data() + b * blocks;
        const float* mr = xm.data() + b * blocks;
        float* o = yp + b * N + g * kGroup;
        switch (std::min<int64_t>(kGroupRows, B - b)) {
          case 1: dot_group<int4, 1>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
          case 2: dot_group<int4, 2>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
          case 3: dot_group<int4, 3>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
#if defined(GYM_VNNI512)
          case 4: dot_group<int4, 4>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
          case 5: dot_group<int4, 5>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
          case 6: dot_group<int4, 6>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
          case 7: dot_group<int4, 7>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
          default: dot_group<int4, 8>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
#else
          default: dot_group<int4, 4>(xr, sr, tr, mr, K, w, s, o, N, ahead); break;
#endif
        }
      }
    }
  });
  return y;
}

at::Tensor linear_q8(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws) {
  TORCH_CHECK(wq.scalar_type() == at::kChar, "int8 weights must be torch.int8");
  return linear_quant<false>(x, wq, ws);
}

at::Tensor linear_q4(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws) {
  TORCH_CHECK(wq.scalar_type() == at::kByte, "int4 weights must be packed two per torch.uint8");
  return linear_quant<true>(x, wq, ws);
}

// -- the glue of a decode step: one call each instead of a handful of small torch ops ----------------------

// y = x / rms(x) * w over the last dimension of a contiguous float32 [rows, width].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && w.scalar_type() == at::kFloat && w.is_contiguous(),
              "rms_norm takes contiguous float32 tensors");
  const int64_t width = w.numel();
  TORCH_CHECK(x.numel() % width == 0, "rms_norm: width mismatch");
  const int64_t rows = x.numel() / width;
  at::Tensor y = at::empty(x.sizes(), x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * width;
      float total = 0.f;
      for (int64_t i = 0; i < width; ++i) total += xr[i] * xr[i];
      const float inv = 1.f / std::sqrt(total / float(width) + float(eps));
      for (int64_t i = 0; i < width; ++i) yp[r * width + i] = xr[i] * inv * wp[i];
    }
  });
  return y;
}

// Rotary embedding in place on the first `heads` heads of x [tokens, all heads, dim] (rotate-half layout,
// as transformers' Llama): x' = x * cos + rotate_half(x) * sin with cos/sin [tokens, dim].
void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous() && x.scalar_type() == at::kFloat, "rope_ takes [tokens, heads, dim]");
  const int64_t tokens = x.size(0), all = x.size(1), dim = x.size(2), half = dim / 2;
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == tokens * dim, "rope_: table shape");
  float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cp + t * dim;
    const float* s = sp + t * dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = xp + (t * all + h) * dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}

// a . b over n floats, and y += a * x: the inner loops of decode attention. Written out because a float sum is
// not vectorized by the compiler without -ffast-math (it may not reorder the additions), and a decode step at
// 16 rows spent a quarter of its time in the scalar dot products of attention.
#ifdef GYM_AVX2
// dot()'s eight partial sums before its horizontal sum, for n a multiple of 8: two chains of eight lanes (d in
// 16s, then one more 8 on the first), added. On AVX-512 one 16-lane register holds both chains (its lower half
// the first), so it takes half the instructions for the same numbers.
inline __m256 dot_lanes(const float* a, const float* b, int64_t n) {
  int64_t d = 0;
#ifdef GYM_AVX512
  __m512 acc = _mm512_setzero_ps();
  for (; d + 16 <= n; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
  __m256 acc0 = _mm512_castps512_ps256(acc);
  const __m256 acc1 = _mm512_maskz_extractf32x8_ps(0xff, acc, 1);
#else
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; d + 16 <= n; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
  }
#endif
  for (; d + 8 <= n; d += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
  return _mm256_add_ps(acc0, acc1);
}

// hsum of eight vectors at once: lane i of the result is hsum(v[i]) to the bit. hsum adds lane l to lane l + 4,
// then those sums 0 + 2 and 1 + 3, then the two; the same pairs are added here, eight vectors per instruction.
inline __m256 hsum8(const __m256* v) {
  __m256 s[4];
  for (int i = 0; i < 4; ++i)  // [v[2i] lanes l + (l + 4) | v[2i + 1]'s]
    s[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  // [v0: 0+2, 1+3, v2: 0+2, 1+3 | v1's, v3's] and the same for v4..v7
  const __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], 0x44), _mm256_shuffle_ps(s[0], s[1], 0xee));
  const __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], 0x44), _mm256_shuffle_ps(s[2], s[3], 0xee));
  const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(u0, u1, 0x88), _mm256_shuffle_ps(u0, u1, 0xdd));  // v0 2 4 6 | 1 3 5 7
  return _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// dot_lanes(q, k_i, n) for the eight keys k_i = k + i * n (n a multiple of 8), q's vectors loaded once for all.
inline void dot_lanes8(const float* q, const float* k, int64_t n, __m256* lanes) {
#ifdef GYM_AVX512
  __m512 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    const __m512 qv = _mm512_loadu_ps(q + d);
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + i * n + d), acc[i]);
  }
  for (int i = 0; i < 8; ++i) {
    __m256 acc0 = _mm512_castps512_ps256(acc[i]);
    if (d + 8 <= n) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + i * n + d), acc0);
    lanes[i] = _mm256_add_ps(acc0, _mm512_maskz_extractf32x8_ps(0xff, acc[i], 1));
  }
#else
  for (int half = 0; half < 8; half += 4) {  // 4 keys x 2 chains: 8 of AVX2's 16 registers
    __m256 acc0[4], acc1[4];
    for (int i = 0; i < 4; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= n; d += 16) {
      const __m256 q0 = _mm256_loadu_ps(q + d), q1 = _mm256_loadu_ps(q + d + 8);
      for (int i = 0; i < 4; ++i) {
        const float* ki = k + (half + i) * n + d;
        acc0[i] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(ki), acc0[i]);
        acc1[i] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(ki + 8), acc1[i]);
      }
    }
    for (int i = 0; i < 4; ++i) {
      if (d + 8 <= n) acc0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + (half + i) * n + d), acc0[i]);
      lanes[half + i] = _mm256_add_ps(acc0[i], acc1[i]);
    }
  }
#endif
}
#endif

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t d = 0;
  float total = 0.f;
#ifdef GYM_AVX2
  d = n / 8 * 8;
  total = hsum(dot_lanes(a, b, d));
#endif
  for (; d < n; ++d) total += a[d] * b[d];
  return total;
}

inline void axpy(float* y, float a, const float* x, int64_t n) {
  int64_t d = 0;
#ifdef GYM_AVX2
  const __m256 av = _mm256_set1_ps(a);
  for (; d + 8 <= n; d += 8) _mm256_storeu_ps(y + d, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
#endif
  for (; d < n; ++d) y[d] += a * x[d];
}

// v[j] = e^(v[j] - shift) for j < n; returns their sum.
inline float exp_shifted(float* v, int64_t n, float shift) {
  int64_t j = 0;
  float total = 0.f;
#ifdef GYM_AVX2
  __m256 sum = _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(shift);
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(v + j), s));
    _mm256_storeu_ps(v + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  total = hsum(sum);
#endif
  for (; j < n; ++j) {
    v[j] = std::exp(v[j] - shift);
    total += v[j];
  }
  return total;
}

// Query heads whose value sums are taken together, sharing each value vector loaded: a prompt's queries are
// bound by reading the values from L2 (a 1,024-position head holds 256 KB of them), not by arithmetic.
#if defined(GYM_AVX512)
constexpr int kHeadsAtOnce = 6;  // x 64 outputs: 24 accumulators, 4 value vectors and a weight
constexpr int64_t kValueWidth = 64;
#elif defined(GYM_AVX2)
constexpr int kHeadsAtOnce = 3;  // x 32 outputs: 12 accumulators and a weight
constexpr int64_t kValueWidth = 32;
#else
constexpr int kHeadsAtOnce = 1;
#endif

// The value sums of G query heads: o[g] = sum_{j < n[g]} p[g][j] v_j. kValueWidth outputs at a time stay in
// registers over every position, each lane a chain of fused multiply-adds in position order: what axpy computes,
// without loading and storing o at each position (a 1,024-token prefill's attention 1.6x faster). Positions that
// only some heads reach continue those heads' chains from o, so each head's numbers are those it gets alone.
template <int G>
inline void weigh_values(const float* const* p, const int64_t* n, const float* vr, int64_t dim, float* const* o,
                         Ahead& ahead_v) {
  int64_t shared = n[0];
  for (int g = 1; g < G; ++g) shared = std::min(shared, n[g]);
  int64_t d0 = 0;
#ifdef GYM_AVX2
#ifdef GYM_AVX512
  using Vec = __m512;
  constexpr int kLanes = 16;
  const auto load = [](const float* x) { return _mm512_loadu_ps(x); };
  const auto fma = [](Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); };
  const auto set1 = [](float a) { return _mm512_set1_ps(a); };
  const auto store = [](float* x, Vec v) { _mm512_storeu_ps(x, v); };
  const auto zero = [] { return _mm512_setzero_ps(); };
#else
  using Vec = __m256;
  constexpr int kLanes = 8;
  const auto load = [](const float* x) { return _mm256_loadu_ps(x); };
  const auto fma = [](Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); };
  const auto set1 = [](float a) { return _mm256_set1_ps(a); };
  const auto store = [](float* x, Vec v) { _mm256_storeu_ps(x, v); };
  const auto zero = [] { return _mm256_setzero_ps(); };
#endif
  constexpr int V = int(kValueWidth) / kLanes;
  for (; d0 + kValueWidth <= dim; d0 += kValueWidth) {
    Vec acc[V * G];
    for (int i = 0; i < V * G; ++i) acc[i] = zero();
    for (int64_t j = 0; j < shared; ++j) {
      ahead_v.step();
      const float* x = vr + j * dim + d0;
      Vec v[V];
      for (int i = 0; i < V; ++i) v[i] = load(x + kLanes * i);
      for (int g = 0; g < G; ++g) {
        const Vec a = set1(p[g][j]);
        for (int i = 0; i < V; ++i) acc[V * g + i] = fma(a, v[i], acc[V * g + i]);
      }
    }
    // On AVX2 every head's sums are stored before any head goes on alone: with both in one loop over the heads,
    // GCC kept acc in memory and stored all twelve at every position, as many stores as multiply-adds (a
    // 1,024-token layer's prompt attention 17.0 -> 12.2 ms, 4 alternating processes, Zen 4, GYM_KERNEL_ISA=avx2).
    // On AVX-512 the split loop was slower (15.3 -> 18.6 ms), so it keeps the one loop. Either way each head's
    // sums are stored before its own positions go on from them: the same numbers.
#if defined(GYM_AVX512)
    constexpr bool kStoreAllFirst = false;
#else
    constexpr bool kStoreAllFirst = true;
#endif
    if constexpr (kStoreAllFirst)
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < V; ++i) store(o[g] + d0 + kLanes * i, acc[V * g + i]);
    for (int g = 0; g < G; ++g) {
      if constexpr (!kStoreAllFirst)
        for (int i = 0; i < V; ++i) store(o[g] + d0 + kLanes * i, acc[V * g + i]);
      if (n[g] == shared) continue;
      Vec own[V];
      for (int i = 0; i < V; ++i) own[i] = load(o[g] + d0 + kLanes * i);
      for (int64_t j = shared; j < n[g]; ++j) {
        const Vec a = set1(p[g][j]);
        for (int i = 0; i < V; ++i) own[i] = fma(a, load(vr + j * dim + d0 + kLanes * i), own[i]);
      }
      for (int i = 0; i < V; ++i) store(o[g] + d0 + kLanes * i, own[i]);
    }
  }
#endif
  if (d0 == dim) return;
  for (int g = 0; g < G; ++g) {
    for (int64_t d = d0; d < dim; ++d) o[g][d] = 0.f;
    for (int64_t j = 0; j < n[g]; ++j) axpy(o[g] + d0, p[g][j], vr + j * dim + d0, dim - d0);
  }
}

// `count` queries of one kv head (q[c] [dim]), query c over positions [0, n[c]) of it: softmax(q . k_j * scale)
// . v_j, into o[c] [dim]. Each query's numbers are the same whatever the others are, so a decode step (one query)
// and a prompt's prefill (a kv head's group of query heads, for two tokens) agree to the bit.
// `ahead_k` / `ahead_v`: cache lines of the keys and values attended next, fetched one step per position.
inline void attend_heads(const float* const* q, const int64_t* n, int64_t count, const float* kr, const float* vr,
                         int64_t dim, float scale, std::vector<float>& scores, float* const* o, Ahead ahead_k = {},
                         Ahead ahead_v = {}) {
  int64_t longest = 0;
  for (int64_t c = 0; c < count; ++c) longest = std::max(longest, n[c]);
  scores.resize(count * longest);
  // Scores for every query up to the longest row: the keys a shorter query does not attend exist (a prompt's keys
  // are stored before its attention) and their scores are not used.
  int64_t j = 0;
#ifdef GYM_AVX2
  // Eight positions at a time: their keys stay in L1 for every query, and one hsum8 replaces eight hsums.
  if (dim % 8 == 0) {
    const __m256 scale_v = _mm256_set1_ps(scale);
    for (; j + 8 <= longest; j += 8) {
      for (int i = 0; i < 8; ++i) ahead_k.step();
      for (int64_t c = 0; c < count; ++c) {
        __m256 lanes[8];
        dot_lanes8(q[c], kr + j * dim, dim, lanes);
        _mm256_storeu_ps(scores.data() + c * longest + j, _mm256_mul_ps(hsum8(lanes), scale_v));
      }
    }
  }
#endif
  for (; j < longest; ++j) {
    ahead_k.step();
    for (int64_t c = 0; c < count; ++c) scores[c * longest + j] = dot(q[c], kr + j * dim, dim) * scale;
  }
  const float* weights[kHeadsAtOnce];
  for (int64_t c = 0; c < count; ++c) {
    float* p = scores.data() + c * longest;
    const int64_t m = n[c];
    float top = -INFINITY;
    int64_t i = 0;
#ifdef GYM_AVX2
    // The largest score, eight lanes wide (a maximum is the same in any order): one scalar chain was four cycles
    // a position.
    __m256 top_v = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= m; i += 8) top_v = _mm256_max_ps(top_v, _mm256_loadu_ps(p + i));
    alignas(32) float tops[8];
    _mm256_store_ps(tops, top_v);
    for (float t : tops) top = std::max(top, t);
#endif
    for (; i < m; ++i) top = std::max(top, p[i]);
    const float total = exp_shifted(p, m, top);
    i = 0;
#ifdef GYM_AVX2
    const __m256 total_v = _mm256_set1_ps(total);  // division is exact-rounded: the same quotients as one by one
    for (; i + 8 <= m; i += 8) _mm256_storeu_ps(p + i, _mm256_div_ps(_mm256_loadu_ps(p + i), total_v));
#endif
    for (; i < m; ++i) p[i] /= total;
  }
  for (int64_t c = 0; c < count; c += kHeadsAtOnce) {
    const int64_t take = std::min<int64_t>(kHeadsAtOnce, count - c);
    for (int64_t g = 0; g < take; ++g) weights[g] = scores.data() + (c + g) * longest;
    switch (take) {
#if defined(GYM_AVX512)
      case 6: weigh_values<6>(weights, n + c, vr, dim, o + c, ahead_v); break;
      case 5: weigh_values<5>(weights, n + c, vr, dim, o + c, ahead_v); break;
      case 4: weigh_values<4>(weights, n + c, vr, dim, o + c, ahead_v); break;
#endif
#if defined(GYM_AVX2)
      case 3: weigh_values<3>(weights, n + c, vr, dim, o + c, ahead_v); break;
      case 2: weigh_values<2>(weights, n + c, vr, dim, o + c, ahead_v); break;
#endif
      default: weigh_values<1>(weights, n + c, vr, dim, o + c, ahead_v); break;
    }
  }
}

// One decode step of attention for each row r: store its new key and value (k, v [rows, kv heads, dim]) at
// position lengths[r] of its slot r, then attend from q [rows, heads, dim] over positions [0, lengths[r]].
// Each row reads only its own length (no padding), and grouped query heads share their kv head.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& keys,
                            at::Tensor& values, const at::Tensor& lengths, double scale) {
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && keys.is_contiguous() &&
              values.is_contiguous() && lengths.is_contiguous() && lengths.scalar_type() == at::kLong,
              "decode_attention takes contiguous tensors and int64 lengths");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = keys.size(1), capacity = keys.size(2), group = heads / kv_heads;
  const int64_t* len = lengths.data_ptr<int64_t>();
  float* kp = keys.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(len[r] < capacity, "decode_attention: the cache is full");
    for (int64_t h = 0; h < kv_heads; ++h) {
      std::memcpy(kp + ((r * kv_heads + h) * capacity + len[r]) * dim, k.data_ptr<float>() + (r * kv_heads + h) * dim,
                  dim * 4);
      std::memcpy(vp + ((r * kv_heads + h) * capacity + len[r]) * dim, v.data_ptr<float>() + (r * kv_heads + h) * dim,
                  dim * 4);
    }
  }
  at::Tensor out = at::empty({rows, heads, dim}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // A step reads each row's keys and values from memory once (its grouped query heads share them, one after
  // the other), so while one kv head's queries attend, the next kv head's positions are fetched, a share per
  // query: at 16 rows, attention read ~70 MB a step at a fraction of the memory's speed.
  parallel_for(0, rows * heads, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / heads, h = i % heads, kv = r * kv_heads + h / group, n = len[r] + 1;
      Ahead ahead_k, ahead_v;
      const int64_t next = kv + 1, next_row = next / kv_heads;
      if (next_row < rows && i + 1 < i1) {
        const int64_t lines = ((len[next_row] + 1) * dim * 4 + 63) / 64, share = h % group;
        const int64_t first = lines * share / group, last = lines * (share + 1) / group;
        const auto* nk = reinterpret_cast<const uint8_t*>(kp + next * capacity * dim);
        const auto* nv = reinterpret_cast<const uint8_t*>(vp + next * capacity * dim);
        const int64_t per_step = (last - first + n - 1) / n;
        ahead_k = Ahead{nk + 64 * first, nk + 64 * last, per_step};
        ahead_v = Ahead{nv + 64 * first, nv + 64 * last, per_step};
      }
      const float* query = qp + i * dim;
      float* answer = op + i * dim;
      attend_heads(&query, &n, 1, kp + kv * capacity * dim, vp + kv * capacity * dim, dim, float(scale), scores,
                   &answer, ahead_k, ahead_v);
    }
  });
  return out;
}

// A prompt's attention in one slot, whose keys and values already hold positions [0, start + n): query i
// (position start + i) attends over [0, start + i]. Each query is computed exactly as a decode step computes
// its row (`attend`), so a position's numbers do not depend on the chunk of the prompt it was prefilled in,
// nor on the other requests of the step.
void prefill_attention_into_(at::Tensor& out, const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                             int64_t slot, int64_t start, double scale) {
  // q may be a view of the chunk's qkv [n, heads + 2 kv, dim] (its first heads): each query head's dim floats
  // are contiguous, and a token's rows are q.stride(0) apart. out [n, heads, dim] may be a chunk's rows of the
  // step's output (several prompts prefilled together).
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2) && keys.is_contiguous() &&
                  values.is_contiguous(),
              "prefill_attention takes q [n, heads, dim] with contiguous heads, and contiguous caches");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kFloat && out.sizes() == q.sizes(),
              "prefill_attention: out must be a contiguous float32 tensor of q's shape");
  const int64_t n = q.size(0), heads = q.size(1), dim = q.size(2), q_row = q.stride(0);
  const int64_t kv_heads = keys.size(1), capacity = keys.size(2), group = heads / kv_heads;
  TORCH_CHECK(start + n <= capacity && slot < keys.size(0), "prefill_attention: positions past the cache");
  const float* qp = q.data_ptr<float>();
  const float* kp = keys.data_ptr<float>() + slot * kv_heads * capacity * dim;
  const float* vp = values.data_ptr<float>() + slot * kv_heads * capacity * dim;
  float* op = out.data_ptr<float>();
  // A kv head's query heads of two consecutive tokens attend together (their positions differ by one), sharing
  // each key and value read. Query t attends over start + t + 1 positions, so the threads take every parts-th
  // item, not a block each: the later tokens' longer rows would otherwise fall to one thread (a first 256-token
  // chunk split 25% / 75%).
  const int64_t pairs = (n + 1) / 2, items = pairs * kv_heads, parts = std::max(1, at::get_num_threads());
  parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> scores;
    std::vector<const float*> queries;
    std::vector<float*> answers;
    std::vector<int64_t> lengths;
    for (int64_t part = p0; part < p1; ++part) {
      for (int64_t i = part; i < items; i += parts) {
        const int64_t t0 = 2 * (i / kv_heads), h = i % kv_heads;
        queries.clear();
        answers.clear();
        lengths.clear();
        for (int64_t t = t0; t < std::min(n, t0 + 2); ++t) {
          for (int64_t g = 0; g < group; ++g) {
            queries.push_back(qp + t * q_row + (h * group + g) * dim);
            answers.push_back(op + (t * heads + h * group + g) * dim);
            lengths.push_back(start + t + 1);
          }
        }
        attend_heads(queries.data(), lengths.data(), int64_t(lengths.size()), kp + h * capacity * dim,
                     vp + h * capacity * dim, dim, float(scale), scores, answers.data());
      }
    }
  });
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, int64_t slot,
                             int64_t start, double scale) {
  at::Tensor out = at::empty(q.sizes(), q.options());
  prefill_attention_into_(out, q, keys, values, slot, start, scale);
  return out;
}

// A prompt chunk's keys and values, heads [heads, heads + kv) and [heads + kv, heads + 2 kv) of qkv [n, all heads,
// dim], into positions [start, start + n) of cache slot `slot` (keys/values [slots, kv, capacity, dim]).
//
// This and add_ below do on the kernels' threads what torch's own operators did in a prompt's layers. A torch
// operator over a chunk's hundreds of rows runs on torch's OpenMP team, and libgomp's idle thread then spins for
// up to milliseconds (its default wait policy, in full while it manages no more threads than there are CPUs) on
// a core the next product's workers compute on. Where the prefilling thread's team was the process's only one,
// a 1,024-token float32 prefill spent 12-15% of its CPU time in that spin (perf, AMD EPYC, 2 cores), and took
// 1.2x less time under OMP_WAIT_POLICY=PASSIVE. Measured with this change, the decoder driven from one thread
// (1,024 tokens, 8 pairs of processes): 1.2-1.55x faster; `gym chat` with a ~1,000-token prompt: 5.78 ->
// 5.45 s wall on average over 9 pairs. Through the engine with transformers' model loaded (a second OpenMP team,
// so a throttled spin) nothing changed beyond noise.
void store_kv_(const at::Tensor& qkv, at::Tensor& keys, at::Tensor& values, int64_t slot, int64_t start,
               int64_t heads) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.is_contiguous() && qkv.scalar_type() == at::kFloat && keys.dim() == 4 &&
                  keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes() &&
                  keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat,
              "store_kv_ takes a contiguous float32 qkv [n, heads + 2 kv, dim] and caches [slots, kv, capacity, dim]");
  const int64_t n = qkv.size(0), all = qkv.size(1), dim = qkv.size(2);
  const int64_t kv = keys.size(1), capacity = keys.size(2);
  TORCH_CHECK(all == heads + 2 * kv && keys.size(3) == dim, "store_kv_: qkv's heads do not match the cache's");
  TORCH_CHECK(slot >= 0 && slot < keys.size(0) && start >= 0 && start + n <= capacity,
              "store_kv_: positions past the cache");
  const float* qp = qkv.data_ptr<float>();
  float* kp = keys.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  parallel_for(0, 2 * kv, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {  // h < kv: key head h; then value head h - kv (qkv head heads + h)
      float* dst = (h < kv ? kp : vp) + ((slot * kv + h % kv) * capacity + start) * dim;
      const float* src = qp + (heads + h) * dim;
      for (int64_t t = 0; t < n; ++t) std::memcpy(dst + t * dim, src + t * all * dim, size_t(dim) * sizeof(float));
    }
  });
}

// x += y, elementwise (a prompt chunk's residual adds; see store_kv_ for why not torch's add).
void add_(at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && x.scalar_type() == at::kFloat &&
                  y.scalar_type() == at::kFloat && x.sizes() == y.sizes(),
              "add_ takes two contiguous float32 tensors of one shape");
  float* xp = x.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  parallel_for(0, x.numel(), int64_t(1) << 15, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) xp[i] += yp[i];
  });
}

// silu(gate) * up for gate_up [rows, 2 * width] (gate first) -> [rows, width].
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.scalar_type() == at::kFloat,
              "silu_mul takes a contiguous float32 [rows, 2 * width]");
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  at::Tensor y = at::empty({rows, width}, gate_up.options());
  const float* g = gate_up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Prefill chunks have hundreds of rows: share them out (a decode step's few rows stay on one thread).
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(width, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* gate = g + r * 2 * width;
      const float* up = gate + width;
      float* out = yp + r * width;
      int64_t i = 0;
#ifdef GYM_AVX2
      const __m256 one = _mm256_set1_ps(1.f);
      for (; i + 8 <= width; i += 8) {
        const __m256 a = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), a));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
      }
#endif
      for (; i < width; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
    }
  });
  return y;
}

// -- a decode step's layers in one call -------------------------------------------------------------------
// The same kernels as the per-layer calls from Python, in the same order, so the numbers are the same; a
// decode step of a 30-layer model makes ~14 calls a layer, and each one from Python costs microseconds of
// dispatch that add up to a good part of a small model's step.
at::Tensor apply_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& s, const at::Tensor& b,
                        int64_t format) {
  at::Tensor y = format == 1 ? linear_q8(x, w, s) : format == 2 ? linear_q4(x, w, s) : linear_float(x, w);
  if (b.numel()) y.add_(b);
  return y;
}

constexpr int64_t kLayerTensors = 16;

// x [rows, hidden] through every layer: per layer `tensors` holds input norm, post-attention norm, q norm,
// k norm (empty: none), then weight, scales (empty for float formats) and bias (empty: none) of qkv, o,
// gate_up and down; `formats` holds each of the four products' format (0 float, 1 int8, 2 int4).
at::Tensor decode_layers(const at::Tensor& x0, at::TensorList tensors, at::IntArrayRef formats, const at::Tensor& cos,
                         const at::Tensor& sin, at::TensorList keys, at::TensorList values, const at::Tensor& lengths,
                         int64_t heads, int64_t kv_heads, int64_t dim, double eps, double scale) {
  const int64_t layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(static_cast<int64_t>(tensors.size()) == layers * kLayerTensors &&
              static_cast<int64_t>(formats.size()) == layers * 4 && static_cast<int64_t>(values.size()) == layers,
              "decode_layers: ", kLayerTensors, " tensors and 4 formats per layer");
  const int64_t rows = x0.size(0);
  at::Tensor x = x0;
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* t = tensors.data() + l * kLayerTensors;
    const int64_t* f = formats.data() + l * 4;
    at::Tensor qkv = apply_linear(rms_norm(x, t[0], eps), t[4], t[5], t[6], f[0]).view({rows, heads + 2 * kv_heads, dim});
    if (t[2].numel() && t[3].numel()) {
      for (const auto& [weight, first, count] : {std::tuple<const at::Tensor&, int64_t, int64_t>{t[2], 0, heads},
                                                 std::tuple<const at::Tensor&, int64_t, int64_t>{t[3], heads, kv_heads}}) {
        at::Tensor part = qkv.narrow(1, first, count);
        part.copy_(rms_norm(part.reshape({-1, dim}).contiguous(), weight, eps).view({rows, count, dim}));
      }
    }
    rope_(qkv, cos, sin, heads + kv_heads);
    at::Tensor layer_keys = keys[l], layer_values = values[l];
    at::Tensor attended = decode_attention(qkv.narrow(1, 0, heads).contiguous(),
                                           qkv.narrow(1, heads, kv_heads).contiguous(),
                                           qkv.narrow(1, heads + kv_heads, kv_heads).contiguous(), layer_keys,
                                           layer_values, lengths, scale);
    x = x.add(apply_linear(attended.view({rows, heads * dim}), t[7], t[8], t[9], f[1]));
    at::Tensor gate_up = apply_linear(rms_norm(x, t[1], eps), t[10], t[11], t[12], f[2]);
    x = x.add(apply_linear(silu_mul(gate_up), t[13], t[14], t[15], f[3]));
  }
  return x;
}

// -- per-row 1-bit deltas ----------------------------------------------------------------------------
// y[row_e, n] += sum_g scale_e[n, g] * sum_{k in group g} x[row_e, k] * sign_e[n, k] for each entry e: a
// BitDelta variant's correction alpha * (x @ sign.T), on the rows of the batch that use that variant.
// The signs stay packed, one bit per weight (1 = +1), so a variant costs 1/32 of a float32 weight read per
// step. They are laid out in tiles of 32 outputs (kernels.tile_signs): byte j of output n (its inputs 8j to
// 8j + 7, lowest bit first) is at (n / 32) * 32 * K/8 + j * 32 + n % 32, outputs past the last zero. One
// 32-byte load then holds 32 outputs' signs for eight inputs, which the table lookups below take whole,
// where the row-major layout needed a gather. With sign = 2b - 1, x . sign = 2 (x . b) - sum(x), and
// x . b is a sum of activations that the bits select.
constexpr int64_t kSignTile = 32;

struct MaskTable {
  alignas(32) uint32_t lanes[256][8];
  MaskTable() {
    for (int b = 0; b < 256; ++b)
      for (int i = 0; i < 8; ++i) lanes[b][i] = (b >> i) & 1 ? 0xffffffffu : 0u;
  }
};

const MaskTable& mask_table() {
  static const MaskTable table;
  return table;
}

// The masked sums (the portable variant, and rows whose groups are not whole blocks of 32): each byte of
// bits selects eight activations through a 256-entry table of lane masks, an AND and an ADD per eight
// weights. Every packed product computes each (row, output) the same way, so a row's correction does not
// depend on which rows share the call (batch invariance): per group g, the masked sum of x over the group's
// set bits in eight lanes, k in order, in one chain; the groups folded into eight lanes as
// h += 2 s_g * that sum; then the lanes summed as ((0+1)+(2+3))+((4+5)+(6+7)), and sum_g s_g * sum(x over g)
// taken off. Four outputs of one row (sign_dot4) and one output of up to four rows (sign_dot_rows) are two
// loops over that one recipe. `bits` points at an output's first byte; its next byte is kSignTile on.

// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the order the paired horizontal adds of sign_dot4 give.
inline float lanes_total(const float* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// out[r] = sum_g s[g] * (x_r . sign over group g) for one output (its bits and scales) and R rows.
template <int R>
inline void sign_dot_rows(const uint8_t* bits, const float* s, int64_t G, int64_t size, int64_t K,
                          const float* const* x, const float* const* group_sum, float* out) {
  float offset[R];
  for (int r = 0; r < R; ++r) {
    offset[r] = 0.f;
    for (int64_t g = 0; g < G; ++g) offset[r] += s[g] * group_sum[r][g];
  }
#ifdef GYM_AVX2
  const MaskTable& table = mask_table();
  __m256 half[R];
  for (int r = 0; r < R; ++r) half[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const int64_t k0 = g * size, k1 = std::min(K, k0 + size);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t k = k0; k < k1; k += 8) {
      const __m256 mask = _mm256_load_ps(reinterpret_cast<const float*>(table.lanes[bits[(k >> 3) * kSignTile]]));
      for (int r = 0; r < R; ++r) acc[r] = _mm256_add_ps(acc[r], _mm256_and_ps(mask, _mm256_loadu_ps(x[r] + k)));
    }
    const __m256 twice = _mm256_set1_ps(2.f * s[g]);
    for (int r = 0; r < R; ++r) half[r] = _mm256_fmadd_ps(twice, acc[r], half[r]);
  }
  alignas(32) float lanes[8];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(lanes, half[r]);
    out[r] = lanes_total(lanes) - offset[r];
  }
#else
  for (int r = 0; r < R; ++r) {
    float dot = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      float masked = 0.f;
      for (int64_t k = g * size; k < std::min(K, (g + 1) * size); ++k)
        if ((bits[(k >> 3) * kSignTile] >> (k & 7)) & 1) masked += x[r][k];
      dot += 2.f * s[g] * masked;
    }
    out[r] = dot - offset[r];
  }
#endif
}

// The same recipe for one activation row and four consecutive outputs (the common case: one row per
// variant in a batch), out[o] = sum_g s[o][g] * (x . sign_o over group g). Each activation vector loaded feeds
// all four outputs, and the horizontal sums are done once for all four.
inline void sign_dot4(const uint8_t* bits, const float* s, int64_t G, int64_t size, int64_t K, const float* x,
                      const float* group_sum, float* out) {
  float offset[4] = {0.f, 0.f, 0.f, 0.f};  // sum_g s[g] * sum(x over g): x . sign = 2 (x . b) - sum(x)
  for (int o = 0; o < 4; ++o)
    for (int64_t g = 0; g < G; ++g) offset[o] += s[o * G + g] * group_sum[g];
#ifdef GYM_AVX2
  const MaskTable& table = mask_table();
  __m256 half[4];
  for (int o = 0; o < 4; ++o) half[o] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const int64_t k0 = g * size, k1 = std::min(K, k0 + size);
    __m256 acc[4];
    for (int o = 0; o < 4; ++o) acc[o] = _mm256_setzero_ps();
    for (int64_t k = k0; k < k1; k += 8) {
      const __m256 xv = _mm256_loadu_ps(x + k);
      for (int o = 0; o < 4; ++o) {
        const __m256 mask = _mm256_load_ps(reinterpret_cast<const float*>(table.lanes[bits[o + (k >> 3) * kSignTile]]));
        acc[o] = _mm256_add_ps(acc[o], _mm256_and_ps(mask, xv));
      }
    }
    for (int o = 0; o < 4; ++o) half[o] = _mm256_fmadd_ps(_mm256_set1_ps(2.f * s[o * G + g]), acc[o], half[o]);
  }
  // Four horizontal sums at once: pairwise adds leave [o0 o1 o2 o3] in each 128-bit half, each summed as
  // lanes_total does.
  const __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(half[0], half[1]), _mm256_hadd_ps(half[2], half[3]));
  const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
  alignas(16) float lanes_out[4];
  _mm_store_ps(lanes_out, sums);
  for (int o = 0; o < 4; ++o) out[o] = lanes_out[o] - offset[o];
#else
  for (int o = 0; o < 4; ++o) {
    float dot = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      float masked = 0.f;
      for (int64_t k = g * size; k < std::min(K, (g + 1) * size); ++k)
        if ((bits[o + (k >> 3) * kSignTile] >> (k & 7)) & 1) masked += x[k];
      dot += 2.f * s[o * G + g] * masked;
    }
    out[o] = dot - offset[o];
  }
#endif
}

#if defined(GYM_AVX2)
// The table-lookup form (as in T-MAC), for rows whose groups are whole blocks of 32: for each four
// activations j of a row, the 16 sums of their subsets, built once per row; then each output's four bits
// for those activations index that table, so one lookup takes four weights of many outputs at once.
#define GYM_SIGN_LUT 1

// tables[16 j + c] = sum of x[4 j + i] over the set bits i of c.
void subset_tables(const float* x, int64_t K, float* tables) {
  const __m256i low = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i high = _mm256_add_epi32(low, _mm256_set1_epi32(8));
  __m256 bit_low[4], bit_high[4];
  for (int i = 0; i < 4; ++i) {
    const __m256i one = _mm256_set1_epi32(1);
    bit_low[i] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(low, i), one));
    bit_high[i] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(high, i), one));
  }
  for (int64_t j = 0; j < K / 4; ++j) {
    __m256 t0 = _mm256_mul_ps(_mm256_set1_ps(x[4 * j]), bit_low[0]);
    __m256 t1 = _mm256_mul_ps(_mm256_set1_ps(x[4 * j]), bit_high[0]);
    for (int i = 1; i < 4; ++i) {
      t0 = _mm256_fmadd_ps(_mm256_set1_ps(x[4 * j + i]), bit_low[i], t0);
      t1 = _mm256_fmadd_ps(_mm256_set1_ps(x[4 * j + i]), bit_high[i], t1);
    }
    _mm256_storeu_ps(tables + 16 * j, t0);
    _mm256_storeu_ps(tables + 16 * j + 8, t1);
  }
}
#endif

#if defined(GYM_AVX512)
// AVX-512: the tables stay float32, one 512-bit vector each, and sixteen outputs go per vector: a permute reads
// the low four bits of each lane, so one permute and one add take 64 weights, where a masked add takes 16.
// A byte of sixteen outputs, widened to sixteen lanes, indexes two tables (its low and its high four bits).
// A tile's two halves of sixteen outputs go in one pass over its signs: each table loaded feeds both, each
// cache line of signs is read once, and four chains of adds are in flight instead of two. The same numbers; the
// 1-bit products of a 16-variant int8 decode step of the embedded model took 14.7-18.3 ms instead of 19.0-22.9
// (two alternations of the two builds, AMD EPYC Zen 4), where a pass per half left half the samples on the
// loads of the signs and the two add chains.

// y[0..valid) += the signed products of outputs 0..valid (valid <= 32) of one entry's tile; s points at the
// first of those outputs' scales; group bounds are multiples of 32.
inline void sign_lut32(const uint8_t* tile, int64_t valid, const float* s, int64_t G, int64_t size, int64_t K,
                       const float* tables, const float* group_sum, float* y) {
  const auto mask_of = [](int64_t count) {
    return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
  };
  const __mmask16 lanes[2] = {mask_of(valid), mask_of(valid - 16)};
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i scale_offsets = _mm512_mullo_epi32(lane, _mm512_set1_epi32(int32_t(G)));
  __m512 total[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t g = 0; g < G; ++g) {
    const int64_t k0 = g * size, k1 = std::min(K, k0 + size);
    __m512 even[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, odd[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = k0; k < k1; k += 32) {
      const float* t = tables + (k / 4) * 16;
      const uint8_t* b = tile + (k >> 3) * kSignTile;
      for (int i = 0; i < 4; ++i) {
        const __m512 low_table = _mm512_loadu_ps(t + 32 * i), high_table = _mm512_loadu_ps(t + 32 * i + 16);
        for (int h = 0; h < 2; ++h) {
          const __m512i idx =
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i * kSignTile + 16 * h)));
          even[h] = _mm512_add_ps(even[h], _mm512_permutexvar_ps(idx, low_table));
          odd[h] = _mm512_add_ps(odd[h], _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), high_table));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const float* sh = s + 16 * h * G;
      const __m512 scale = G == 1 ? _mm512_maskz_loadu_ps(lanes[h], sh)
                                  : _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes[h], scale_offsets, sh + g, 4);
      // x . sign over the group = 2 (x . bits) - sum(x)
      const __m512 bits_dot = _mm512_add_ps(even[h], odd[h]);
      const __m512 dot = _mm512_sub_ps(_mm512_add_ps(bits_dot, bits_dot), _mm512_set1_ps(group_sum[g]));
      total[h] = _mm512_fmadd_ps(scale, dot, total[h]);
    }
  }
  for (int h = 0; h < 2; ++h)
    _mm512_mask_storeu_ps(y + 16 * h, lanes[h], _mm512_add_ps(_mm512_maskz_loadu_ps(lanes[h], y + 16 * h), total[h]));
}
#elif defined(GYM_AVX2)
// AVX2 has no 16-entry float permute (a table is two vectors, a lookup two permutes and a blend, 5 weights
// per instruction: no faster than the masked sums). Its byte shuffle is a 16-entry table lookup for 32 lanes
// at once, so the tables go into fixed point: each row's subset sums scaled by one step (2^22 steps to the
// largest) and rounded to integers u + 2^22 in [0, 2^23], kept as three byte planes. A shuffle per plane
// looks up 32 outputs; the planes are summed apart as 16-bit lanes, and every 512 activations (128 lookups:
// the sums stay under 2^15 per plane, 2^30 in all) folded into float64. x . b over a group is then that sum
// times the step, exact to the rounding of the tables: at most half a step per lookup, 2^-23 of the row's
// largest subset sum. Float products of the merged weights round at about 2^-24 of each product, so the two
// agree to ~1e-6 relative; tests/personalization/test_batched.py holds both to the float64 reference.
#define GYM_SIGN_PLANES 1
constexpr int kPlaneBits = 22;
constexpr int64_t kPlaneChunk = 512;  // activations between folds into float64
constexpr int64_t kPlaneBytes = 48;   // per four activations: three planes of sixteen entries

// planes[48 j + 16 p + c] = byte p of round(tables[16 j + c] / step) + 2^22; returns the step.
double quantize_tables(const float* tables, int64_t K, uint8_t* planes) {
  __m256 largest = _mm256_setzero_ps();
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < K * 4; i += 8) largest = _mm256_max_ps(largest, _mm256_and_ps(magnitude, _mm256_loadu_ps(tables + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  const float top = *std::max_element(lanes, lanes + 8);
  const float inverse = top > 0.f ? float(1 << kPlaneBits) / top : 1.f;
  const __m256 scale = _mm256_set1_ps(inverse);
  const __m256i bias = _mm256_set1_epi32(1 << kPlaneBits), low_byte = _mm256_set1_epi32(0xff);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t j = 0; j < K / 4; ++j) {
    // cvtps rounds to nearest even; u stays within [0, 2^23] (|sum| <= top, so |sum * inverse| <= 2^22 + ulp)
    const __m256i a = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(tables + 16 * j), scale)), bias);
    const __m256i b = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(tables + 16 * j + 8), scale)), bias);
    for (int p = 0; p < 3; ++p) {
      const __m256i pa = _mm256_and_si256(_mm256_srli_epi32(a, 8 * p), low_byte);
      const __m256i pb = _mm256_and_si256(_mm256_srli_epi32(b, 8 * p), low_byte);
      // packs: [a0-3 b0-3 | a4-7 b4-7] as 16 bits, packus: the same as bytes twice per half; then in order
      const __m256i words = _mm256_packs_epi32(pa, pb);
      const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words, words), order);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + kPlaneBytes * j + 16 * p), _mm256_castsi256_si128(bytes));
    }
  }
  return 1.0 / double(inverse);
}

// Fold one chunk's plane sums into float64, per output in lane order (see plane_output). word[p] holds the
// 16-bit sums of each pair of outputs' bytes (the even output's sum plus 256 times the odd's, modulo 2^16),
// odd[p] the odd outputs' sums alone, so even = word - 256 odd.
inline void fold_planes(const __m256i* word, const __m256i* odd, int64_t lookups, double* acc) {
  const __m256i zero = _mm256_setzero_si256();
  __m256i part[4] = {zero, zero, zero, zero};  // even lo, even hi, odd lo, odd hi: 32-bit lanes
  for (int p = 0; p < 3; ++p) {
    const __m256i even = _mm256_sub_epi16(word[p], _mm256_slli_epi16(odd[p], 8));
    const int shift = 8 * p;
    part[0] = _mm256_add_epi32(part[0], _mm256_slli_epi32(_mm256_unpacklo_epi16(even, zero), shift));
    part[1] = _mm256_add_epi32(part[1], _mm256_slli_epi32(_mm256_unpackhi_epi16(even, zero), shift));
    part[2] = _mm256_add_epi32(part[2], _mm256_slli_epi32(_mm256_unpacklo_epi16(odd[p], zero), shift));
    part[3] = _mm256_add_epi32(part[3], _mm256_slli_epi32(_mm256_unpackhi_epi16(odd[p], zero), shift));
  }
  const __m256i bias = _mm256_set1_epi32(int32_t(lookups << kPlaneBits));
  for (int q = 0; q < 4; ++q) {
    const __m256i exact = _mm256_sub_epi32(part[q], bias);
    __m256d* a = reinterpret_cast<__m256d*>(acc + 8 * q);
    _mm256_store_pd(acc + 8 * q, _mm256_add_pd(a[0], _mm256_cvtepi32_pd(_mm256_castsi256_si128(exact))));
    _mm256_store_pd(acc + 8 * q + 4, _mm256_add_pd(a[1], _mm256_cvtepi32_pd(_mm256_extracti128_si256(exact, 1))));
  }
}

// The output (of 32) that fold_planes leaves at acc[8 q + m]: unpacklo/hi take 16-bit lanes 0-3 / 4-7 of each
// 128-bit half, and the 16-bit lane l holds outputs 2 l (even) and 2 l + 1 (odd).
constexpr int plane_output(int q, int m) {
  return 2 * ((q % 2 == 0) ? (m < 4 ? m : m + 4) : (m < 4 ? m + 4 : m + 8)) + (q >= 2 ? 1 : 0);
}

inline __m256i broadcast16(const uint8_t* p) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// y[0..valid) += the signed products of the outputs of one tile (valid <= 32) of one entry.
inline void sign_planes32(const uint8_t* tile, int64_t valid, const float* s, int64_t G, int64_t size, int64_t K,
                          const uint8_t* planes, double step, const float* group_sum, float* y) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  // Neither array is zeroed with `= {}`: that became a `rep stos` each, ~6% of this function's time.
  alignas(32) double total[kSignTile];  // set by the first group
  for (int64_t g = 0; g < G; ++g) {
    const int64_t k0 = g * size, k1 = std::min(K, k0 + size);
    alignas(32) double acc[kSignTile];
    for (int64_t i = 0; i < kSignTile; i += 4) _mm256_store_pd(acc + i, _mm256_setzero_pd());
    for (int64_t c0 = k0; c0 < k1; c0 += kPlaneChunk) {
      const int64_t c1 = std::min(k1, c0 + kPlaneChunk);
      __m256i w0 = _mm256_setzero_si256(), w1 = w0, w2 = w0, o0 = w0, o1 = w0, o2 = w0;
      // Each plane's lookup is added as soon as it is made: fewer vectors live at once, no spills.
      const auto add = [&](const uint8_t* table, __m256i index) {
        const __m256i r0 = _mm256_shuffle_epi8(broadcast16(table), index);
        w0 = _mm256_add_epi16(w0, r0);
        o0 = _mm256_add_epi16(o0, _mm256_srli_epi16(r0, 8));
        const __m256i r1 = _mm256_shuffle_epi8(broadcast16(table + 16), index);
        w1 = _mm256_add_epi16(w1, r1);
        o1 = _mm256_add_epi16(o1, _mm256_srli_epi16(r1, 8));
        const __m256i r2 = _mm256_shuffle_epi8(broadcast16(table + 32), index);
        w2 = _mm256_add_epi16(w2, r2);
        o2 = _mm256_add_epi16(o2, _mm256_srli_epi16(r2, 8));
      };
      const uint8_t* t = planes + (c0 / 4) * kPlaneBytes;
      for (const uint8_t *v = tile + (c0 >> 3) * kSignTile, *end = tile + (c1 >> 3) * kSignTile; v < end;
           v += kSignTile, t += 2 * kPlaneBytes) {
        const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
        add(t, _mm256_and_si256(codes, low4));                                    // inputs 8j .. 8j + 3
        add(t + kPlaneBytes, _mm256_and_si256(_mm256_srli_epi16(codes, 4), low4));  // 8j + 4 .. 8j + 7
      }
      const __m256i word[3] = {w0, w1, w2}, odd[3] = {o0, o1, o2};
      fold_planes(word, odd, (c1 - c0) / 4, acc);
    }
    for (int q = 0; q < 4; ++q)
      for (int m = 0; m < 8; ++m) {
        const int o = plane_output(q, m);
        if (o >= valid) continue;
        const double part = double(s[o * G + g]) * (2.0 * acc[8 * q + m] * step - double(group_sum[g]));
        total[o] = g == 0 ? part : total[o] + part;
      }
  }
  for (int64_t o = 0; o < valid; ++o) y[o] += float(total[o]);
}
#endif

// sum(x[0..n)) in eight lanes (one chain of adds per lane, a whole row's in a few hundred cycles where one
// chain took thousands), summed as lanes_total does, then the tail; the same every call for the same x.
inline float range_sum(const float* x, int64_t n) {
  int64_t k = 0;
  float total = 0.f;
#ifdef GYM_AVX2
  __m256 lanes = _mm256_setzero_ps();
  for (; k + 8 <= n; k += 8) lanes = _mm256_add_ps(lanes, _mm256_loadu_ps(x + k));
  alignas(32) float l[8];
  _mm256_store_ps(l, lanes);
  total = lanes_total(l);
#endif
  for (; k < n; ++k) total += x[k];
  return total;
}

// out[g] = the sum of x over group g (x . sign = 2 (x . b) - that sum), for the G groups of `size` of a row.
inline void group_sums(const float* x, int64_t K, int64_t size, int64_t G, float* out) {
  for (int64_t g = 0; g < G; ++g) out[g] = range_sum(x + g * size, std::min(K, (g + 1) * size) - g * size);
}

constexpr int64_t kSignAhead = 2;  // tiles of signs to prefetch ahead

#ifdef GYM_SIGN_LUT
inline void prefetch_tile(const uint8_t* tile, int64_t tile_bytes) {
  const char* at = reinterpret_cast<const char*>(tile);
  for (int64_t line = 0; line < tile_bytes; line += 64) _mm_prefetch(at + line, _MM_HINT_T0);
}
#endif

inline bool sign_tables_on() {
  // GYM_SIGN_LUT=0 keeps every entry on the masked sums: the baseline bench/variants.py measures the table
  // lookups against, in the same build.
  static const bool on = [] {
    const char* setting = std::getenv("GYM_SIGN_LUT");
    return setting == nullptr || std::strcmp(setting, "0") != 0;
  }();
  return on;
}

#ifdef GYM_SIGN_LUT
// The table lookups (AVX2's byte planes, AVX-512's float permutes) when every entry takes them and no two entries
// share a row (a decode step's batch, one variant per row): the (entry, tile) pairs are split between the threads
// in one pass, and a thread builds the tables of each entry it reaches in its own scratch, just before that
// entry's tiles. A split by tiles alone needs every entry's tables first: a second pass behind a wait for both
// threads, a buffer of all entries' tables zeroed at every call, and each thread reading each entry's signs in
// runs of a few KB; here each entry's signs are one stream (1.16-1.23x on a step's 1-bit products, AVX2 EPYC Zen 3;
// on Zen 4's AVX-512 path 20.8 against 21.5 ms a step, within the noise).
// Each output is computed as in the split by tiles, so the numbers are the same. Returns false (nothing done)
// where it does not apply.
bool sign_lut_by_entry(float* yp, const float* xp, const int64_t* row, int64_t E, int64_t K, int64_t N,
                       const std::vector<const uint8_t*>& bit_ptr, const std::vector<const float*>& scale_ptr,
                       const std::vector<int64_t>& groups, at::IntArrayRef group_sizes) {
  if (K % 32 != 0 || !sign_tables_on()) return false;
  for (int64_t e = 0; e < E; ++e)
    if (group_sizes[e] % 32 != 0 && group_sizes[e] < K) return false;
  std::vector<int64_t> sorted(row, row + E);
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return false;
  const int64_t tiles = (N + kSignTile - 1) / kSignTile, tile_bytes = kSignTile * K / 8;
  parallel_for(0, E * tiles, 1, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> tables, group_sum;
    tables.resize(K * 4);
#ifdef GYM_SIGN_PLANES
    thread_local std::vector<uint8_t> planes;
    planes.resize(K / 4 * kPlaneBytes);
#endif
    const auto prefetch = [&](int64_t item) {
      if (item < i1) prefetch_tile(bit_ptr[item / tiles] + (item % tiles) * tile_bytes, tile_bytes);
    };
    for (int64_t i = i0; i < i1;) {
      const int64_t e = i / tiles, first = i % tiles, last = std::min(tiles, first + (i1 - i));
      const float* xr = xp + row[e] * K;
      const int64_t G = groups[e], size = group_sizes[e];
      group_sum.resize(G);
      group_sums(xr, K, size, G, group_sum.data());
      subset_tables(xr, K, tables.data());
#ifdef GYM_SIGN_PLANES
      const double step = quantize_tables(tables.data(), K, planes.data());
#endif
      for (int64_t t = first; t < last; ++t, ++i) {
        prefetch(i + kSignAhead);
        const int64_t n = t * kSignTile, valid = std::min<int64_t>(kSignTile, N - n);
        const uint8_t* b = bit_ptr[e] + t * tile_bytes;
#ifdef GYM_SIGN_PLANES
        sign_planes32(b, valid, scale_ptr[e] + n * G, G, size, K, planes.data(), step, group_sum.data(),
                      yp + row[e] * N + n);
#else
        sign_lut32(b, valid, scale_ptr[e] + n * G, G, size, K, tables.data(), group_sum.data(), yp + row[e] * N + n);
#endif
      }
    }
  });
  return true;
}
#endif

void sign_matmul_add_(at::Tensor& y, const at::Tensor& x, const at::Tensor& rows, at::TensorList bits,
                      at::TensorList scales, at::IntArrayRef group_sizes) {
  const int64_t E = rows.numel(), K = x.size(1), N = y.size(1);
  check_input(x, K);
  TORCH_CHECK(y.dim() == 2 && y.scalar_type() == at::kFloat && y.is_contiguous() && y.size(0) == x.size(0),
              "y must be a contiguous float32 [rows, out] matching x");
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.is_contiguous(), "rows must be a contiguous int64 tensor");
  TORCH_CHECK(int64_t(bits.size()) == E && int64_t(scales.size()) == E && int64_t(group_sizes.size()) == E,
              "one sign matrix, scale grid and group size per entry");
  TORCH_CHECK(K % 8 == 0, "packed sign rows need a multiple of 8 inputs, got ", K);
  const int64_t tiles = (N + kSignTile - 1) / kSignTile, tile_bytes = kSignTile * K / 8;
  const int64_t* row = rows.data_ptr<int64_t>();
  std::vector<const uint8_t*> bit_ptr(E);
  std::vector<const float*> scale_ptr(E);
  std::vector<int64_t> groups(E);
  for (int64_t e = 0; e < E; ++e) {
    TORCH_CHECK(row[e] >= 0 && row[e] < x.size(0), "entry row out of range");
    const int64_t size = group_sizes[e];
    TORCH_CHECK(size > 0 && (size % 8 == 0 || size >= K), "group size must be a multiple of 8 (or the row)");
    groups[e] = (K + size - 1) / size;
    TORCH_CHECK(bits[e].scalar_type() == at::kByte && bits[e].is_contiguous() && bits[e].numel() == tiles * tile_bytes,
                "sign matrix ", e, " must hold ", tiles * tile_bytes, " bytes: [", N, ", ", K,
                "] signs in tiles of 32 outputs (kernels.tile_signs)");
    TORCH_CHECK(scales[e].scalar_type() == at::kFloat && scales[e].is_contiguous() &&
                scales[e].numel() == N * groups[e], "scale grid ", e, " must be float32 [", N, ", ", groups[e], "]");
    bit_ptr[e] = bits[e].data_ptr<uint8_t>();
    scale_ptr[e] = scales[e].data_ptr<float>();
  }
  float* yp = y.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
#ifdef GYM_SIGN_LUT
  if (sign_lut_by_entry(yp, xp, row, E, K, N, bit_ptr, scale_ptr, groups, group_sizes)) return;
#endif
  // Runs of entries sharing one sign matrix, at most four long.
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t e = 0; e < E;) {
    int64_t end = e + 1;
    while (end < E && end - e < 4 && bit_ptr[end] == bit_ptr[e] && scale_ptr[end] == scale_ptr[e] &&
           group_sizes[end] == group_sizes[e])
      ++end;
    runs.emplace_back(e, end);
    e = end;
  }
  // Per entry, the sum of its row's activations over each group (x . sign = 2 (x . b) - that sum), and where
  // it takes the table lookups, its tables: built in parallel over the entries, each as it is alone.
  std::vector<int64_t> sum_at(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) sum_at[e + 1] = sum_at[e] + groups[e];
  std::vector<float> group_sum(sum_at[E]);
  std::vector<char> lookup(E, 0);
#ifdef GYM_SIGN_LUT
  if (K % 32 == 0 && sign_tables_on())
    for (int64_t e = 0; e < E; ++e) lookup[e] = group_sizes[e] % 32 == 0 || group_sizes[e] >= K;
  std::vector<int64_t> table_at(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) table_at[e + 1] = table_at[e] + (lookup[e] ? K / 4 : 0);
  std::vector<float> tables(table_at[E] * 16);
#ifdef GYM_SIGN_PLANES
  std::vector<uint8_t> planes(table_at[E] * kPlaneBytes);
  std::vector<double> steps(E, 1.0);
#endif
#endif
  parallel_for(0, E, 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const float* xr = xp + row[e] * K;
      const int64_t size = group_sizes[e];
      group_sums(xr, K, size, groups[e], group_sum.data() + sum_at[e]);
#ifdef GYM_SIGN_LUT
      if (!lookup[e]) continue;
      subset_tables(xr, K, tables.data() + table_at[e] * 16);
#ifdef GYM_SIGN_PLANES
      steps[e] = quantize_tables(tables.data() + table_at[e] * 16, K, planes.data() + table_at[e] * kPlaneBytes);
#endif
#endif
    }
  });
  parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
#ifdef GYM_SIGN_LUT
    // The signs are read once per step, from memory: a thread's tiles of one entry are a short stream (tens of
    // KB) that the hardware prefetchers barely ramp up on before the next entry's begins (a step's 212 MB of
    // signs streamed at ~6 GB/s). So each tile asks for the one kSignAhead on, in this thread's order: the same
    // entry's, or past its last tile the next entry's first. A prefetch of memory never read does not fault.
    const auto prefetch_ahead = [&](int64_t e, int64_t tile) {
      int64_t target = tile + kSignAhead;
      if (target >= t1) {
        target = t0 + (target - t1);
        if (++e >= E || !lookup[e] || target >= t1) return;
      }
      prefetch_tile(bit_ptr[e] + target * tile_bytes, tile_bytes);
    };
#endif
    for (const auto& [first, last] : runs) {
      const int64_t G = groups[first], size = group_sizes[first];
#ifdef GYM_SIGN_LUT
      if (lookup[first]) {
        for (int64_t e = first; e < last; ++e)
          for (int64_t n = t0 * kSignTile; n < std::min(N, t1 * kSignTile); n += kSignTile) {
            prefetch_ahead(e, n / kSignTile);
            const uint8_t* b = bit_ptr[e] + (n / kSignTile) * tile_bytes;
            const int64_t valid = std::min<int64_t>(kSignTile, N - n);
            float* out = yp + row[e] * N + n;
#if defined(GYM_SIGN_PLANES)
            sign_planes32(b, valid, scale_ptr[e] + n * G, G, size, K, planes.data() + table_at[e] * kPlaneBytes,
                          steps[e], group_sum.data() + sum_at[e], out);
#else
            sign_lut32(b, valid, scale_ptr[e] + n * G, G, size, K, tables.data() + table_at[e] * 16,
                       group_sum.data() + sum_at[e], out);
#endif
          }
        continue;
      }
#endif
      const int R = int(last - first);
      const float* xs[4];
      const float* sums[4];
      for (int r = 0; r < R; ++r) {
        xs[r] = xp + row[first + r] * K;
        sums[r] = group_sum.data() + sum_at[first + r];
      }
      const int64_t end = std::min(N, t1 * kSignTile);
      int64_t n = t0 * kSignTile;
      auto bytes_of = [&](int64_t output) {
        return bit_ptr[first] + (output / kSignTile) * tile_bytes + output % kSignTile;
      };
      if (R == 1) {
        for (; n + 4 <= end; n += 4) {  // four outputs of one tile: n is a multiple of 4
          float out[4];
          sign_dot4(bytes_of(n), scale_ptr[first] + n * G, G, size, K, xs[0], sums[0], out);
          for (int o = 0; o < 4; ++o) yp[row[first] * N + n + o] += out[o];
        }
      }
      for (; n < end; ++n) {
        const uint8_t* b = bytes_of(n);
        const float* s = scale_ptr[first] + n * G;
        float out[4];
        switch (R) {
          case 1: sign_dot_rows<1>(b, s, G, size, K, xs, sums, out); break;
          case 2: sign_dot_rows<2>(b, s, G, size, K, xs, sums, out); break;
          case 3: sign_dot_rows<3>(b, s, G, size, K, xs, sums, out); break;
          default: sign_dot_rows<4>(b, s, G, size, K, xs, sums, out); break;
        }
        for (int r = 0; r < R; ++r) yp[row[first + r] * N + n] += out[r];
      }
    }
  });
}

#include "pack.cpp"
#include "sampling.cpp"

}  // namespace

extern const gym_kernels::Ops ops;  // external linkage: dispatch.cpp reads every variant's table
const gym_kernels::Ops ops = {GYM_ISA_NAME,      &linear_float,     &linear_q8,   &linear_q4,        &rms_norm,
                              &rope_,            &decode_attention, &prefill_attention, &silu_mul, &decode_layers,
                              &sign_matmul_add_, &pack_q8,       &pack_q4,   &store_kv_,        &add_,
                              &prefill_attention_into_, &softmax_rows, &nucleus_pick};

}  // namespace GYM_ISA_NS
