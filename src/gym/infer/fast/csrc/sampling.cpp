// Sampling a batch of rows: softmax(logits / temperature) per row, and top-p (nucleus) picks. gym.infer.sampling did
// both through torch and numpy: at 16 streams ~3 ms of a ~38 ms int4 step, ~1 ms here.
//
// One thread, the caller's. On the kernels' two threads 16 rows took 0.7 instead of 0.9 ms on an engine's thread,
// but 7.7 ms on a thread whose torch operators had just run: torch's OpenMP worker, spinning after them, held the
// core the kernels' worker waited for (see the top of linear.cpp), and sampling comes right after torch's
// operators in a transformers engine.
//
// Each row is computed alone, in a fixed order, so a row's probabilities do not depend on the rows beside it (a
// seeded request samples the same alone or in a batch).
//
// A nucleus pick must be the token gym.infer.sampling._nucleus_pick gives: the candidates are the tokens at least
// `cut` times as likely as the likeliest (that product rounded to float32, as numpy computes it), ordered by
// descending probability with ties by token id (numpy's stable argsort), their probabilities summed in float64 in
// that order. Only the nucleus needs ordering, usually a few hundred of the candidates, so they are ordered a chunk
// at a time (nth_element, then a sort of the chunk) until the running sum passes top_p.
//
// Included by linear.cpp inside the variant's namespace; the scans over the vocabulary use the variant's vectors.

// The row's largest value, or NaN where the row holds a NaN (numpy's max propagates it).
inline float row_max(const float* values, int64_t vocab) {
  int64_t v = 0;
  float m = -INFINITY;
  bool nan = false;
#ifdef GYM_AVX2
  __m256 best = _mm256_set1_ps(-INFINITY), unordered = _mm256_setzero_ps();
  for (; v + 8 <= vocab; v += 8) {
    const __m256 x = _mm256_loadu_ps(values + v);
    best = _mm256_max_ps(best, x);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, best);
  for (float lane : lanes) m = std::max(m, lane);
  nan = _mm256_movemask_ps(unordered) != 0;
#endif
  for (; v < vocab; ++v) {
    nan |= std::isnan(values[v]);
    m = std::max(m, values[v]);
  }
  return nan ? NAN : m;
}

// Probabilities of one row: e^(x - max) / sum with x = logits / temperature (divided, as torch divides), the
// exponentials as attention takes them (exp_shifted). A -inf logit (a token a grammar forbids) gets probability 0;
// a row with a NaN, or with every logit -inf, is all NaN, as torch's softmax makes it.
inline void softmax_row(const float* logits, float* out, int64_t vocab, float temperature) {
  for (int64_t v = 0; v < vocab; ++v) out[v] = logits[v] / temperature;
  const float m = row_max(out, vocab);
  if (std::isnan(m) || m == -INFINITY) {
    std::fill(out, out + vocab, NAN);
    return;
  }
  const float sum = exp_shifted(out, vocab, m);
  const float inverse = 1.f / sum;
  for (int64_t v = 0; v < vocab; ++v) out[v] *= inverse;
}

at::Tensor softmax_rows(const at::Tensor& logits, at::ArrayRef<double> temperatures) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == at::kFloat,
              "softmax_rows takes contiguous float32 logits [rows, vocab]");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(int64_t(temperatures.size()) == rows, "softmax_rows takes one temperature per row");
  at::Tensor probs = at::empty({rows, vocab}, logits.options());
  const float* l = logits.data_ptr<float>();
  float* p = probs.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) softmax_row(l + r * vocab, p + r * vocab, vocab, float(temperatures[r]));
  return probs;
}

struct NucleusCandidate {
  double p;
  int64_t token;
};

// A function object, not a function: std::sort and nth_element then inline the comparison instead of calling
// through a pointer (half the time of a row went to those calls).
struct NucleusBefore {
  bool operator()(const NucleusCandidate& a, const NucleusCandidate& b) const {
    return a.p > b.p || (a.p == b.p && a.token < b.token);
  }
};

// The tokens with probability >= cut, in token order, appended to `out`; false (and `out` incomplete) as soon as
// there are more than `limit`.
inline bool gather_candidates(const float* probs, int64_t vocab, float cut, int64_t limit,
                              std::vector<NucleusCandidate>& out) {
  int64_t v = 0;
#ifdef GYM_AVX2
  // Most of a vocabulary is far below the cut: test eight at a time, look closer only where one passes.
  const __m256 threshold = _mm256_set1_ps(cut);
  for (; v + 8 <= vocab; v += 8) {
    unsigned mask = unsigned(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(probs + v), threshold, _CMP_GE_OQ)));
    while (mask != 0) {
      const int64_t token = v + __builtin_ctz(mask);
      out.push_back({double(probs[token]), token});
      mask &= mask - 1;
    }
    if (int64_t(out.size()) > limit) return false;
  }
#endif
  for (; v < vocab && int64_t(out.size()) <= limit; ++v)
    if (probs[v] >= cut) out.push_back({double(probs[v]), v});
  return int64_t(out.size()) <= limit;
}

// One row's pick, or -1 where its candidates may not hold its nucleus (the caller then takes the full path).
inline int64_t nucleus_row(const float* probs, int64_t vocab, double top_p, double draw, float cut_ratio,
                           int64_t limit, std::vector<NucleusCandidate>& candidates) {
  const float m = row_max(probs, vocab);
  if (std::isnan(m)) return -1;
  candidates.clear();
  if (!gather_candidates(probs, vocab, m * cut_ratio, limit, candidates)) return -1;
  const int64_t n = int64_t(candidates.size());
  double total = 0.0;
  for (const auto& c : candidates) total += c.p;
  if (n == 0 || total < top_p + 1e-6) return -1;  // numpy's test, with its margin for another order of summation
  // numpy drops each candidate whose cumulative sum less its own probability reaches top_p, and rounds that
  // difference, so the test is made as it makes it. Once the sum itself passes top_p by far more than a rounding
  // error, every later candidate is dropped, and the rest need no ordering: the candidates are ordered a chunk at
  // a time (nth_element, then a sort of the chunk) until then. Kept candidates keep their probability, dropped ones
  // count as zero in the inverse CDF below.
  int64_t examined = 0, chunk = 64;
  double cumulative = 0.0;
  bool settled = false;
  while (!settled && examined < n) {
    const int64_t end = std::min(n, examined + chunk);
    auto first = candidates.begin() + examined, last = candidates.begin() + end;
    if (end < n) std::nth_element(first, last, candidates.end(), NucleusBefore());
    std::sort(first, last, NucleusBefore());
    for (; examined < end && !settled; ++examined) {
      NucleusCandidate& c = candidates[examined];
      cumulative += c.p;
      if (cumulative - c.p >= top_p) c.p = 0.0;
      settled = cumulative >= top_p + 1e-9;
    }
    chunk *= 2;
  }
  // Inverse CDF: the first candidate, in order, whose cumulative kept probability reaches draw * the kept total.
  double kept_total = 0.0;
  for (int64_t i = 0; i < examined; ++i) kept_total += candidates[i].p;
  const double target = draw * kept_total;
  double cdf = 0.0;
  for (int64_t i = 0; i < examined; ++i) {
    cdf += candidates[i].p;
    if (!(cdf < target)) return candidates[i].token;
  }
  return candidates[std::min(examined, n - 1)].token;
}

at::Tensor nucleus_pick(const at::Tensor& probs, at::ArrayRef<double> top_p, at::ArrayRef<double> draws,
                        double cut_ratio, int64_t limit) {
  TORCH_CHECK(probs.dim() == 2 && probs.is_contiguous() && probs.scalar_type() == at::kFloat,
              "nucleus_pick takes contiguous float32 probabilities [rows, vocab]");
  const int64_t rows = probs.size(0), vocab = probs.size(1);
  TORCH_CHECK(int64_t(top_p.size()) == rows && int64_t(draws.size()) == rows,
              "nucleus_pick takes one top_p and one draw per row");
  at::Tensor picks = at::empty({rows}, probs.options().dtype(at::kLong));
  const float* p = probs.data_ptr<float>();
  int64_t* out = picks.data_ptr<int64_t>();
  const float cut = float(cut_ratio);
  std::vector<NucleusCandidate> candidates;
  candidates.reserve(size_t(std::min<int64_t>(limit + 8, vocab)));
  for (int64_t r = 0; r < rows; ++r) out[r] = nucleus_row(p + r * vocab, vocab, top_p[r], draws[r], cut, limit, candidates);
  return picks;
}
