// src/core/split_heuristic.hpp — how many chunks the KV range of a decoding step is
// split into (flash-decoding). Performance-only: every split count gives the same
// result up to rounding; this only decides how well the GPU is filled.
//
// Decoding has few work items (batch * heads_kv * query blocks: the GQA group's
// query heads are packed into one item) and long key ranges, so without splitting
// most SMs idle. Splitting multiplies the CTAs by n at the cost of merging n partial
// rows. The rule follows flash_attn's num_splits_heuristic, filling `ctas_per_sm`
// CTAs per SM rather than one where the work is long enough:
//   1. Enough items to fill ~80% of the CTA slots already: 1 split.
//   2. Else, for n = 1 .. min(max_splits, key blocks), the wave efficiency
//      e(n) = waves / ceil(waves), waves = items * n / slots; n is eligible if it
//      changes the blocks per split (ceil(blocks / n) != ceil(blocks / (n - 1))).
//   3. The smallest eligible n with e(n) >= 0.95 * max e.
//   4. If that leaves each split fewer than `min_blocks_to_share_sm` key blocks, the
//      step is short: a second CTA per SM costs more than it brings (with one CTA per
//      SM the next step's CTAs launch early into the free slot, and two splits merge
//      inside one cluster instead of a combine kernel), so redo 1-3 with one CTA per
//      SM (slots = sm_count).
// With streaming_ctas set, rules 1-3 run on that many slots and rule 4 is off.
// Measured on the H100 (2026-11-22, batch 8, 8 kv heads, d128, bf16, the cp.async
// kernel): KV 1k best at 2 splits (one CTA per SM), KV 16k-64k at 4 (two per SM);
// batch 1 at KV 64k-128k best at 32-33 splits (85% of the best efficiency picked 28:
// 3-5% slower). The TMA kernel's target (2026-11-25, kernel_choice.hpp): 66 CTAs, so
// batch 8 runs 1 split and batch 1 runs 8.
#pragma once

#include <cstdint>

namespace flashattn {

struct SplitProblem {
  std::int64_t batch = 1;
  std::int64_t heads_kv = 1;
  std::int64_t query_blocks = 1;  // CTAs per (batch, kv head) along the packed query rows
  std::int64_t seqlen_k = 0;      // the longest key range (the cache capacity when lengths are device-side)
  std::int64_t block_n = 64;      // keys per tile of the kernel
  int sm_count = 1;
  int ctas_per_sm = 2;
  int max_splits = 64;
  std::int64_t min_blocks_to_share_sm = 16;  // rule 4
  // > 0: the CTAs the kernel streams a step best with, used as the slots of rules 1-3
  // instead of sm_count * ctas_per_sm (and rule 4 is off). The TMA kernel draws more
  // than an even share of HBM bandwidth per SM, so fewer, longer CTAs win there
  // (kernel_choice.hpp: tma_streaming_ctas).
  std::int64_t streaming_ctas = 0;
};

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Rules 2-3 for `items` work items of `key_blocks` blocks on `slots` CTA slots.
constexpr int best_splits(std::int64_t items, std::int64_t key_blocks, std::int64_t slots, std::int64_t max_splits) {
  std::int64_t limit = max_splits < key_blocks ? max_splits : key_blocks;
  if (limit < 1) return 1;
  const auto eligible = [&](std::int64_t n) {
    return n == 1 || ceil_div(key_blocks, n) != ceil_div(key_blocks, n - 1);
  };
  const auto efficiency = [&](std::int64_t n) {
    const double waves = static_cast<double>(items * n) / static_cast<double>(slots);
    const auto whole = static_cast<double>(ceil_div(items * n, slots));
    return waves / whole;
  };
  double best = 0.0;
  for (std::int64_t n = 1; n <= limit; ++n)
    if (eligible(n) && efficiency(n) > best) best = efficiency(n);
  for (std::int64_t n = 1; n <= limit; ++n)
    if (eligible(n) && efficiency(n) >= 0.95 * best) return static_cast<int>(n);
  return 1;
}

constexpr int choose_num_splits(const SplitProblem& p) {
  const std::int64_t items = p.batch * p.heads_kv * p.query_blocks;
  const std::int64_t sms = p.sm_count > 0 ? p.sm_count : 1;
  const std::int64_t ctas_per_sm = p.ctas_per_sm > 0 ? p.ctas_per_sm : 1;
  const std::int64_t key_blocks = ceil_div(p.seqlen_k > 0 ? p.seqlen_k : 0, p.block_n > 0 ? p.block_n : 1);
  // Rule 1 (with `slots` CTA slots), then rules 2-3.
  const auto splits_for = [&](std::int64_t slots) {
    if (items <= 0 || key_blocks <= 1 || items * 10 >= slots * 8) return 1;
    return best_splits(items, key_blocks, slots, p.max_splits);
  };
  if (p.streaming_ctas > 0) return splits_for(p.streaming_ctas);
  const int shared = splits_for(sms * ctas_per_sm);
  if (ctas_per_sm == 1 || shared == 1 || ceil_div(key_blocks, shared) >= p.min_blocks_to_share_sm) return shared;
  return splits_for(sms);  // rule 4
}

}  // namespace flashattn
