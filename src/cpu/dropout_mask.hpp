// src/cpu/dropout_mask.hpp — dropout's keep mask Z for a rectangle of (row, column)
// positions of one head, one Philox draw per 16 elements (the element sets of
// flashattn/dropout.hpp), for the CPU flash paths.
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashattn/dropout.hpp"

namespace flashattn::cpu {

// Calls keep_at(row, col, kept) for every (row, col) of [row_begin, row_end) x
// [col_begin, col_end) once.
template <class F>
void for_each_dropout_decision(const DropoutRule& rule, std::uint32_t batch_head, std::int64_t row_begin,
                               std::int64_t row_end, std::int64_t col_begin, std::int64_t col_end, F&& keep_at) {
  if (row_begin >= row_end || col_begin >= col_end) return;
  // Sets span 16 rows x 32 columns blocks: rows r, r + 8 and columns c + 8t, c + 8t + 1 (t < 4).
  for (std::int64_t block_row = row_begin / 16 * 16; block_row < row_end; block_row += 16)
    for (std::int64_t block_col = col_begin / 32 * 32; block_col < col_end; block_col += 32)
      for (int g = 0; g < 8; ++g) {
        const std::int64_t row_base = block_row + g;
        if (row_base >= row_end || row_base + 8 < row_begin) continue;
        for (int q = 0; q < 4; ++q) {
          const std::int64_t col_base = block_col + 2 * q;
          if (col_base >= col_end || col_base + 25 < col_begin) continue;
          const std::uint32_t mask = rule.keep_mask(rule.draw(batch_head, row_base, col_base));
          for (int index = 0; index < 16; ++index) {
            const std::int64_t row = row_base + 8 * ((index >> 1) & 1);
            const std::int64_t col = col_base + 8 * (index >> 2) + (index & 1);
            if (row < row_begin || row >= row_end || col < col_begin || col >= col_end) continue;
            keep_at(row, col, ((mask >> index) & 1u) != 0);
          }
        }
      }
}

}  // namespace flashattn::cpu
