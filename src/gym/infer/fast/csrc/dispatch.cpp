// The torch operators of the gym_kernels library, each calling the chosen instruction-set variant of the
// kernels (linear.cpp compiled once per variant by the isa_*.cpp files). One library then runs on any x86-64
// CPU, and on each takes its best path: the variant is chosen when the library loads, from what the CPU
// (and the OS, for AVX-512's registers) supports, and may be changed with gym_kernels::use_isa (the
// GYM_KERNEL_ISA setting, and the tests that check every variant this CPU can run against a reference).
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <string>
#include <vector>

#include "ops.h"

#ifndef GYM_KERNEL_SOURCE_HASH
#define GYM_KERNEL_SOURCE_HASH unknown
#endif
#define GYM_STRING_(x) #x
#define GYM_STRING(x) GYM_STRING_(x)
#define GYM_SOURCE_HASH GYM_STRING(GYM_KERNEL_SOURCE_HASH)

namespace gym_isa_portable {
extern const gym_kernels::Ops ops;
}
#if defined(__x86_64__)
namespace gym_isa_avx2 {
extern const gym_kernels::Ops ops;
}
namespace gym_isa_avx512 {
extern const gym_kernels::Ops ops;
}
namespace gym_isa_avx512_vnni {
extern const gym_kernels::Ops ops;
}
#endif

namespace {

// Read from the file's bytes by gym.infer.fast.kernels before the library is loaded, to tell a build of
// older sources (an editable install whose csrc changed since) from a current one.
[[gnu::used]] const char kSourceHash[] = "GYM_KERNEL_SOURCE_HASH=" GYM_SOURCE_HASH;

struct Variant {
  const gym_kernels::Ops* ops;
  bool (*runs)();
};

bool always() { return true; }

#if defined(__x86_64__)
// __builtin_cpu_supports checks the OS's register support too (XGETBV), so an AVX-512 CPU under an OS or
// hypervisor that does not save its registers is not offered the AVX-512 variants.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
bool runs_avx2() { return __builtin_cpu_supports("x86-64-v3"); }
bool runs_avx512() { return __builtin_cpu_supports("x86-64-v4"); }
#else
bool runs_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2");
}
bool runs_avx512() {
  return runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512cd");
}
#endif
bool runs_avx512_vnni() { return runs_avx512() && __builtin_cpu_supports("avx512vnni"); }
#endif

// Best first.
const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
#if defined(__x86_64__)
      {&gym_isa_avx512_vnni::ops, &runs_avx512_vnni},
      {&gym_isa_avx512::ops, &runs_avx512},
      {&gym_isa_avx2::ops, &runs_avx2},
#endif
      {&gym_isa_portable::ops, &always},
  };
  return all;
}

const gym_kernels::Ops* best() {
  for (const auto& v : variants())
    if (v.runs()) return v.ops;
  return &gym_isa_portable::ops;
}

std::atomic<const gym_kernels::Ops*> active_ops{nullptr};

const gym_kernels::Ops& active() {
  const gym_kernels::Ops* ops = active_ops.load(std::memory_order_acquire);
  if (ops == nullptr) {
    ops = best();
    active_ops.store(ops, std::memory_order_release);
  }
  return *ops;
}

std::vector<std::string> isas() {
  std::vector<std::string> names;
  for (const auto& v : variants())
    if (v.runs()) names.emplace_back(v.ops->name);
  return names;
}

std::string use_isa(const std::string& name) {
  if (name.empty() || name == "auto") {
    active_ops.store(best(), std::memory_order_release);
    return active().name;
  }
  std::string known;
  for (const auto& v : variants()) {
    if (name == v.ops->name) {
      TORCH_CHECK(v.runs(), "GYM_KERNEL_ISA=", name, ": this CPU cannot run the ", name, " kernels (it runs: ",
                  c10::Join(", ", isas()), ")");
      active_ops.store(v.ops, std::memory_order_release);
      return name;
    }
    known += (known.empty() ? "" : ", ") + std::string(v.ops->name);
  }
  TORCH_CHECK(false, "GYM_KERNEL_ISA=", name, ": no such kernel variant (choose auto, ", known, ")");
}

std::string isa() { return active().name; }
std::string source_hash() { return GYM_SOURCE_HASH; }

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) { return active().linear(x, w); }
at::Tensor linear_q8(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws) {
  return active().linear_q8(x, wq, ws);
}
at::Tensor linear_q4(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws) {
  return active().linear_q4(x, wq, ws);
}
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) { return active().rms_norm(x, w, eps); }
void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads) {
  active().rope_(x, cos, sin, heads);
}
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& keys,
                            at::Tensor& values, const at::Tensor& lengths, double scale) {
  return active().decode_attention(q, k, v, keys, values, lengths, scale);
}
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, int64_t slot,
                             int64_t start, double scale) {
  return active().prefill_attention(q, keys, values, slot, start, scale);
}
at::Tensor silu_mul(const at::Tensor& gate_up) { return active().silu_mul(gate_up); }
at::Tensor decode_layers(const at::Tensor& x0, at::TensorList tensors, at::IntArrayRef formats, const at::Tensor& cos,
                         const at::Tensor& sin, at::TensorList keys, at::TensorList values, const at::Tensor& lengths,
                         int64_t heads, int64_t kv_heads, int64_t dim, double eps, double scale) {
  return active().decode_layers(x0, tensors, formats, cos, sin, keys, values, lengths, heads, kv_heads, dim, eps, scale);
}
void sign_matmul_add_(at::Tensor& y, const at::Tensor& x, const at::Tensor& rows, at::TensorList bits,
                      at::TensorList scales, at::IntArrayRef group_sizes) {
  active().sign_matmul_add_(y, x, rows, bits, scales, group_sizes);
}

std::tuple<at::Tensor, at::Tensor> pack_q8(const at::Tensor& weight, const at::Tensor& factors) {
  return active().pack_q8(weight, factors);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_q4(const at::Tensor& weight) { return active().pack_q4(weight); }
void store_kv_(const at::Tensor& qkv, at::Tensor& keys, at::Tensor& values, int64_t slot, int64_t start,
               int64_t heads) {
  active().store_kv_(qkv, keys, values, slot, start, heads);
}
void add_(at::Tensor& x, const at::Tensor& y) { active().add_(x, y); }
void prefill_attention_into_(at::Tensor& out, const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                             int64_t slot, int64_t start, double scale) {
  active().prefill_attention_into_(out, q, keys, values, slot, start, scale);
}

at::Tensor softmax_rows(const at::Tensor& logits, at::ArrayRef<double> temperatures) {
  return active().softmax_rows(logits, temperatures);
}
at::Tensor nucleus_pick(const at::Tensor& probs, at::ArrayRef<double> top_p, at::ArrayRef<double> draws,
                        double cut_ratio, int64_t limit) {
  return active().nucleus_pick(probs, top_p, draws, cut_ratio, limit);
}

}  // namespace

TORCH_LIBRARY(gym_kernels, m) {
  m.def("linear(Tensor x, Tensor w) -> Tensor", &linear);
  m.def("linear_q8(Tensor x, Tensor wq, Tensor ws) -> Tensor", &linear_q8);
  m.def("linear_q4(Tensor x, Tensor wq, Tensor ws) -> Tensor", &linear_q4);
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm);
  m.def("rope_(Tensor(a!) x, Tensor cos, Tensor sin, int heads) -> ()", &rope_);
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) keys, Tensor(b!) values, Tensor lengths, "
        "float scale) -> Tensor", &decode_attention);
  m.def("prefill_attention(Tensor q, Tensor keys, Tensor values, int slot, int start, float scale) -> Tensor",
        &prefill_attention);
  m.def("prefill_attention_into_(Tensor(a!) out, Tensor q, Tensor keys, Tensor values, int slot, int start, "
        "float scale) -> ()", &prefill_attention_into_);
  m.def("silu_mul(Tensor gate_up) -> Tensor", &silu_mul);
  m.def("decode_layers(Tensor x, Tensor[] tensors, int[] formats, Tensor cos, Tensor sin, Tensor(a!)[] keys, "
        "Tensor(b!)[] values, Tensor lengths, int heads, int kv_heads, int dim, float eps, float scale) -> Tensor",
        &decode_layers);
  m.def("sign_matmul_add_(Tensor(a!) y, Tensor x, Tensor rows, Tensor[] bits, Tensor[] scales, int[] group_sizes) -> ()",
        &sign_matmul_add_);
  m.def("pack_q8(Tensor weight, Tensor factors) -> (Tensor, Tensor)", &pack_q8);
  m.def("pack_q4(Tensor weight) -> (Tensor, Tensor, Tensor)", &pack_q4);
  m.def("store_kv_(Tensor qkv, Tensor(a!) keys, Tensor(b!) values, int slot, int start, int heads) -> ()", &store_kv_);
  m.def("add_(Tensor(a!) x, Tensor y) -> ()", &add_);
  m.def("softmax_rows(Tensor logits, float[] temperatures) -> Tensor", &softmax_rows);
  m.def("nucleus_pick(Tensor probs, float[] top_p, float[] draws, float cut_ratio, int limit) -> Tensor",
        &nucleus_pick);
  m.def("use_isa(str name) -> str", &use_isa);
  m.def("isa() -> str", &isa);
  m.def("isas() -> str[]", &isas);
  m.def("source_hash() -> str", &source_hash);
}
