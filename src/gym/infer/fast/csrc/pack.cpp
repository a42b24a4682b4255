// Packing float weights into the int8 and int4 block formats: the same numbers as the torch reference
// (gym.infer.fast.kernels.pack_int8 / pack_int4, which say what the formats are and why), computed one block of 32
// at a time in registers instead of sixteen passes over the whole matrix. A model's first start packs every
// weight (~10 s of a 13 s start on the embedded model through torch), and packing must give the same bytes on
// every CPU and in both implementations, so every operation below is one the reference makes, in its order:
// float32 throughout, no fused multiply-add (the library is built with -ffp-contract=off), round to nearest even,
// and block sums added by halves (kernels._halving_sum), never in an order that depends on the vector width.
//
// Included by linear.cpp inside the variant's namespace, so each instruction-set variant compiles it for its own
// vector width; the loops are written for the compiler to vectorize.

constexpr int kPackBlock = 32;

// x rounded to float16 and back, as torch's .half().float(): round to nearest, ties to even (F16C's conversion
// where the variant has it: c10::Half's, in software, was a third of the packing time).
inline float through_half(float x) {
#ifdef GYM_AVX2
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
  return static_cast<float>(c10::Half(x));
#endif
}

// Round to nearest, ties to even (torch.round), by adding and removing 1.5 * 2^23: exact for |x| < 2^22, and
// vectorizable (without -ffast-math the compiler keeps both operations). Larger magnitudes only occur where the
// result is then clamped to a code range far below them, which it still is.
constexpr float kMagic = 12582912.0f;
inline float round_even(float x) { return (x + kMagic) - kMagic; }

inline float clamp_to(float x, float low, float high) { return std::min(std::max(x, low), high); }

// The sum of 32 values as kernels._halving_sum adds them; `v` is overwritten.
inline float halving_sum(float* v) {
  for (int width = kPackBlock / 2; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) v[i] += v[i + width];
  return v[0];
}

constexpr int kFactors = 16;  // kernels.SCALE_FACTORS

// One block's squared error under each of the kFactors scales (kernels._best_scales): the scales side by side,
// so each operation is a vector across them (one AVX-512 register) and the 16 searches run at once, every
// error still summed by halves in the reference's order.
inline void symmetric_errors(const float* b, const float* scale, const float* inverse, float* errors) {
  float squares[kPackBlock][kFactors];
  for (int i = 0; i < kPackBlock; ++i)
    for (int f = 0; f < kFactors; ++f) {
      const float q = clamp_to(round_even(b[i] * inverse[f]), -127.0f, 127.0f);
      const float e = q * scale[f] - b[i];
      squares[i][f] = e * e;
    }
  for (int width = kPackBlock / 2; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i)
      for (int f = 0; f < kFactors; ++f) squares[i][f] += squares[i + width][f];
  for (int f = 0; f < kFactors; ++f) errors[f] = squares[0][f];
}

// Codes 0..15 of one block for (step, low), and their squared error (kernels._int4_codes).
inline float asymmetric_codes(const float* b, float step, float low, float* codes) {
  const float inverse = step != 0.0f ? 1.0f / step : 0.0f;
  float squares[kPackBlock];
  for (int i = 0; i < kPackBlock; ++i) {
    codes[i] = clamp_to(round_even((b[i] - low) * inverse), 0.0f, 15.0f);
    const float e = (codes[i] * step + low) - b[i];
    squares[i] = e * e;
  }
  return halving_sum(squares);
}

// weight [N, K] float32 -> (int8 codes [N, K], float32 scales [N, K/32]), row-major; the caller lays them out.
std::tuple<at::Tensor, at::Tensor> pack_q8(const at::Tensor& weight, const at::Tensor& factors) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "pack_q8 takes a contiguous float32 matrix");
  TORCH_CHECK(weight.size(1) % kPackBlock == 0, "pack_q8: columns must be a multiple of 32");
  const at::Tensor tried = factors.contiguous().to(at::kFloat);
  TORCH_CHECK(tried.numel() == kFactors, "pack_q8 tries ", kFactors, " scales");
  const int64_t N = weight.size(0), K = weight.size(1), blocks = K / kPackBlock;
  at::Tensor codes = at::empty({N, K}, weight.options().dtype(at::kChar));
  at::Tensor scales = at::empty({N, blocks}, weight.options());
  const float* w = weight.data_ptr<float>();
  const float* factor = tried.data_ptr<float>();
  int8_t* q = codes.data_ptr<int8_t>();
  float* s = scales.data_ptr<float>();
  parallel_for(0, N * blocks, 64, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      const float* b = w + block * kPackBlock;
      float largest = 0.0f;
      for (int i = 0; i < kPackBlock; ++i) largest = std::max(largest, std::fabs(b[i]));
      const float base = largest / 127.0f;
      float scale[kFactors], inverse[kFactors], errors[kFactors];
      for (int f = 0; f < kFactors; ++f) {
        scale[f] = through_half(base * factor[f]);
        inverse[f] = scale[f] != 0.0f ? 1.0f / scale[f] : 0.0f;
      }
      symmetric_errors(b, scale, inverse, errors);
      float best = base, best_error = INFINITY;
      for (int f = 0; f < kFactors; ++f)
        if (errors[f] < best_error) best = scale[f], best_error = errors[f];
      const float best_inverse = best != 0.0f ? 1.0f / best : 0.0f;
      for (int i = 0; i < kPackBlock; ++i)
        q[block * kPackBlock + i] = static_cast<int8_t>(clamp_to(round_even(b[i] * best_inverse), -127.0f, 127.0f));
      s[block] = best;
    }
  });
  return {codes, scales};
}

// weight [N, K] float32 -> (uint8 codes 0..15 [N, K], float32 steps [N, K/32], float32 minimums [N, K/32]):
// the block's own range, then four least-squares refits of (step, minimum), each kept where it lowers the error.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_q4(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "pack_q4 takes a contiguous float32 matrix");
  TORCH_CHECK(weight.size(1) % kPackBlock == 0, "pack_q4: columns must be a multiple of 32");
  const int64_t N = weight.size(0), K = weight.size(1), blocks = K / kPackBlock;
  at::Tensor codes = at::empty({N, K}, weight.options().dtype(at::kByte));
  at::Tensor steps = at::empty({N, blocks}, weight.options());
  at::Tensor lows = at::empty({N, blocks}, weight.options());
  const float* w = weight.data_ptr<float>();
  uint8_t* out = codes.data_ptr<uint8_t>();
  float* step_out = steps.data_ptr<float>();
  float* low_out = lows.data_ptr<float>();
  constexpr float kCount = static_cast<float>(kPackBlock);
  parallel_for(0, N * blocks, 64, [&](int64_t first, int64_t last) {
    float current[kPackBlock], fitted[kPackBlock], scratch[kPackBlock];
    for (int64_t block = first; block < last; ++block) {
      const float* b = w + block * kPackBlock;
      float largest = b[0], smallest = b[0];
      for (int i = 1; i < kPackBlock; ++i) largest = std::max(largest, b[i]), smallest = std::min(smallest, b[i]);
      float step = through_half((largest - smallest) / 15.0f), low = through_half(smallest);
      float error = asymmetric_codes(b, step, low, current);
      for (int i = 0; i < kPackBlock; ++i) scratch[i] = b[i];
      const float sum_b = halving_sum(scratch);
      for (int round = 0; round < 4; ++round) {
        for (int i = 0; i < kPackBlock; ++i) scratch[i] = current[i];
        const float sum_q = halving_sum(scratch);
        for (int i = 0; i < kPackBlock; ++i) scratch[i] = current[i] * current[i];
        const float sum_qq = halving_sum(scratch);
        for (int i = 0; i < kPackBlock; ++i) scratch[i] = current[i] * b[i];
        const float sum_qb = halving_sum(scratch);
        const float det = kCount * sum_qq - sum_q * sum_q;
        const bool solvable = det > 0.0f;
        const float fit_step = through_half(solvable ? (kCount * sum_qb - sum_q * sum_b) / det : step);
        const float fit_low = through_half(solvable ? (sum_b - fit_step * sum_q) / kCount : low);
        const float fit_error = asymmetric_codes(b, fit_step, fit_low, fitted);
        if (fit_error < error) {
          step = fit_step, low = fit_low, error = fit_error;
          for (int i = 0; i < kPackBlock; ++i) current[i] = fitted[i];
        }
      }
      for (int i = 0; i < kPackBlock; ++i) out[block * kPackBlock + i] = static_cast<uint8_t>(current[i]);
      step_out[block] = step;
      low_out[block] = low;
    }
  });
  return {codes, steps, lows};
}
