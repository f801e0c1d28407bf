// tools/accuracy.hpp — comparing the library's results with the float64 reference
// under the precision-relative tolerance rule of STYLE.md:
//   max|out - ref64| <= factor * max|out_lowprec_ref - ref64| + floor
// where out_lowprec_ref is the naive algorithm computed in the input precision,
// factor 2 for outputs and LSE, 3 for gradients.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/workload.hpp"

namespace flashattn::tools {

class ErrorStats {
 public:
  ErrorStats(double factor, double floor) : factor_(factor), floor_(floor) {}
  // One element: the library's value, the float64 reference, the low-precision reference.
  // -inf (a fully masked row's LSE) must be matched exactly; NaN always fails.
  void add(double value, double reference, double lowprec);
  double max_error() const { return max_error_; }
  double tolerance() const { return factor_ * max_lowprec_error_ + floor_; }
  bool passed() const { return !has_nan_ && max_error_ <= tolerance(); }
  std::int64_t count() const { return count_; }
  // "1.2e-06 <= 3.4e-06" or "NaN" / "1.2e-02 > 3.4e-06".
  std::string summary() const;

 private:
  double factor_, floor_;
  double max_error_ = 0.0, max_lowprec_error_ = 0.0;
  bool has_nan_ = false;
  std::int64_t count_ = 0;
};

struct ForwardAccuracy {
  ErrorStats out;
  ErrorStats lse;
  bool passed() const { return out.passed() && lse.passed(); }
};

struct BackwardAccuracy {
  ErrorStats dq, dk, dv;
  bool passed() const { return dq.passed() && dk.passed() && dv.passed(); }
};

// A query row of the problem: batch item, query head, row.
struct RowIndex {
  std::int64_t batch, head, row;
};

// Every row, against the full reference (small problems). Outputs must be downloaded.
ForwardAccuracy check_forward(Workload& workload);
// Only the given rows: each is checked as its own one-row problem over exactly
// the keys its mask lets it see, so big problems check in milliseconds.
ForwardAccuracy check_forward_rows(Workload& workload, const std::vector<RowIndex>& rows);
// `count` random rows (repeats possible), starting with the first and the last row.
std::vector<RowIndex> sample_rows(const Problem& problem, std::int64_t count, std::uint64_t seed);
// dq, dk, dv against the reference gradients (small problems).
BackwardAccuracy check_backward(Workload& workload);

}  // namespace flashattn::tools
