/// \file
/// Exceptions and the precondition macros used by host code. Device code never throws.
#pragma once

#include <stdexcept>
#include <string>

namespace agoq {

/// Thrown when an argument breaks a documented precondition (null pointer with a non-zero size,
/// mismatched extents, an invalid spec). The message names the file, the line and the problem.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Thrown when a valid scheme is asked of a path that does not compile it (for example a group
/// size outside the dispatch set of `dispatch`).
class unsupported_scheme : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Thrown when a CUDA runtime call fails; the message carries the CUDA error string.
class cuda_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

[[noreturn]] inline void throw_invalid(char const* file, int line, std::string const& msg) {
  throw invalid_argument(std::string("agoq: ") + msg + " (" + file + ":" + std::to_string(line) +
                         ")");
}

}  // namespace detail
}  // namespace agoq

/// Checks a host-side precondition; throws agoq::invalid_argument naming the problem otherwise.
#define AGOQ_EXPECTS(cond, msg)                                            \
  do {                                                                     \
    if (!(cond)) ::agoq::detail::throw_invalid(__FILE__, __LINE__, (msg)); \
  } while (0)
