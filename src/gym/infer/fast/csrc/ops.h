// The kernels one instruction-set variant provides (linear.cpp compiled by an isa_*.cpp), as a table of
// function pointers: dispatch.cpp registers the torch operators once and calls the chosen variant's table.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace gym_kernels {

struct Ops {
  const char* name;
  at::Tensor (*linear)(const at::Tensor& x, const at::Tensor& w);
  at::Tensor (*linear_q8)(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws);
  at::Tensor (*linear_q4)(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& ws);
  at::Tensor (*rms_norm)(const at::Tensor& x, const at::Tensor& w, double eps);
  void (*rope_)(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads);
  at::Tensor (*decode_attention)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& keys,
                                 at::Tensor& values, const at::Tensor& lengths, double scale);
  at::Tensor (*prefill_attention)(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, int64_t slot,
                                  int64_t start, double scale);
  at::Tensor (*silu_mul)(const at::Tensor& gate_up);
  at::Tensor (*decode_layers)(const at::Tensor& x0, at::TensorList tensors, at::IntArrayRef formats,
                              const at::Tensor& cos, const at::Tensor& sin, at::TensorList keys, at::TensorList values,
                              const at::Tensor& lengths, int64_t heads, int64_t kv_heads, int64_t dim, double eps,
                              double scale);
  void (*sign_matmul_add_)(at::Tensor& y, const at::Tensor& x, const at::Tensor& rows, at::TensorList bits,
                           at::TensorList scales, at::IntArrayRef group_sizes);
  std::tuple<at::Tensor, at::Tensor> (*pack_q8)(const at::Tensor& weight, const at::Tensor& factors);
  std::tuple<at::Tensor, at::Tensor, at::Tensor> (*pack_q4)(const at::Tensor& weight);
  void (*store_kv_)(const at::Tensor& qkv, at::Tensor& keys, at::Tensor& values, int64_t slot, int64_t start,
                    int64_t heads);
  void (*add_)(at::Tensor& x, const at::Tensor& y);
  void (*prefill_attention_into_)(at::Tensor& out, const at::Tensor& q, const at::Tensor& keys,
                                  const at::Tensor& values, int64_t slot, int64_t start, double scale);
  at::Tensor (*softmax_rows)(const at::Tensor& logits, at::ArrayRef<double> temperatures);
  at::Tensor (*nucleus_pick)(const at::Tensor& probs, at::ArrayRef<double> top_p, at::ArrayRef<double> draws,
                             double cut_ratio, int64_t limit);
};

}  // namespace gym_kernels
