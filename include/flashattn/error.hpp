// flashattn/error.hpp — the one exception type the library throws for bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace flashattn {

// Thrown for every invalid argument, before any output is written. The message
// names the argument and says what was expected and what was given, e.g.
//   "flashattn: k: dtype mismatch: expected float16 (like q), got bfloat16".
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

// Thrown when the input is valid but this build or backend cannot run it
// (e.g. a CUDA tensor in a build without CUDA, or a feature not implemented yet).
class NotSupported : public Error {
 public:
  using Error::Error;
};

}  // namespace flashattn
