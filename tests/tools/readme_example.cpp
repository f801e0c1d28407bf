// Attention forward and backward on the CPU through flashattn's C++ API.
#include <cmath>
#include <cstdio>
#include <vector>

#include "flashattn/flashattn.hpp"

int main() {
  using flashattn::DType;
  using flashattn::TensorView;
  const std::int64_t batch = 2, seqlen = 128, heads = 8, heads_kv = 2, head_dim = 64;  // GQA: 4 query heads per KV head

  // flash_attn's layout: q [batch, seqlen, heads, head_dim], k/v [batch, seqlen, heads_kv, head_dim].
  std::vector<float> q(batch * seqlen * heads * head_dim), k(batch * seqlen * heads_kv * head_dim), v(k.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11f * static_cast<float>(i));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.05f * static_cast<float>(i) + 1.0f);
  std::vector<float> out(q.size()), lse(batch * heads * seqlen);  // lse: [batch, heads, seqlen]

  flashattn::ForwardArgs args;
  args.q = TensorView::contiguous(q.data(), DType::float32, {batch, seqlen, heads, head_dim});
  args.k = TensorView::contiguous(k.data(), DType::float32, {batch, seqlen, heads_kv, head_dim});
  args.v = TensorView::contiguous(v.data(), DType::float32, {batch, seqlen, heads_kv, head_dim});
  args.out = TensorView::contiguous(out.data(), DType::float32, {batch, seqlen, heads, head_dim});
  args.maybe_lse = TensorView::contiguous(lse.data(), DType::float32, {batch, heads, seqlen});
  args.options.causal = true;  // softmax_scale defaults to 1/sqrt(head_dim)
  flashattn::forward(args);    // bad arguments throw flashattn::Error naming the argument

  // Backward: gradients of sum(out * dout) with respect to q, k and v.
  std::vector<float> dout(out.size(), 1.0f), dq(q.size()), dk(k.size()), dv(v.size());
  flashattn::BackwardArgs grad;
  grad.q = args.q, grad.k = args.k, grad.v = args.v, grad.out = args.out, grad.lse = args.maybe_lse;
  grad.dout = TensorView::contiguous(dout.data(), DType::float32, {batch, seqlen, heads, head_dim});
  grad.dq = TensorView::contiguous(dq.data(), DType::float32, {batch, seqlen, heads, head_dim});
  grad.dk = TensorView::contiguous(dk.data(), DType::float32, {batch, seqlen, heads_kv, head_dim});
  grad.dv = TensorView::contiguous(dv.data(), DType::float32, {batch, seqlen, heads_kv, head_dim});
  grad.options = args.options;
  flashattn::backward(grad);

  // With causal masking the first query row sees only key 0, so its output is v's row 0
  // (query head 5 reads KV head 5 / 4 = 1).
  const float first = out[5 * head_dim], expected = v[1 * head_dim];
  std::printf("out[0, 0, 5, 0] = %.6f (v[0, 0, 1, 0] = %.6f), lse[0, 5, 0] = %.6f, dk[0] = %.6f, dv[0] = %.6f\n",
              first, expected, lse[5 * seqlen], dk[0], dv[0]);
  return std::abs(first - expected) < 1e-5f ? 0 : 1;
}
