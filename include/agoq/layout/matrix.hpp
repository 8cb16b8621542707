/// \file
/// Non-owning views of the unquantized tensors agoq reads and writes.
#pragma once

#include <cstdint>

#include <cuda/std/mdspan>

namespace agoq {

/// A row-major [rows, cols] view of elements with 64-bit extents (a flat buffer is one row).
template <class T>
using matrix_view = cuda::std::mdspan<T, cuda::std::dextents<std::int64_t, 2>>;

/// Views `n` contiguous elements as one row.
template <class T>
constexpr matrix_view<T> as_row(T* data, std::int64_t n) noexcept {
  return matrix_view<T>(data, std::int64_t{1}, n);
}

}  // namespace agoq
