// bench/gpu/kernels/gradient_difference.hpp — how far a run's gradients are from a reference
// run's, as the timing tools report it beside their times.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

// max |ours - reference| / max |reference| over every element (the absolute difference when
// the reference is all zero); NaN if either holds a NaN (a poisoned element left unwritten).
inline double max_relative_difference(const std::vector<float>& ours, const std::vector<float>& reference) {
  double difference = 0, magnitude = 0;
  bool has_nan = false;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    has_nan = has_nan || std::isnan(ours[i]) || std::isnan(reference[i]);
    difference = std::max(difference, static_cast<double>(std::fabs(ours[i] - reference[i])));
    magnitude = std::max(magnitude, static_cast<double>(std::fabs(reference[i])));
  }
  return has_nan ? NAN : (magnitude > 0 ? difference / magnitude : difference);
}
