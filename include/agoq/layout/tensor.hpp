/// \file
/// The owning host container of a quantized tensor.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "layout.hpp"
#include "view.hpp"

namespace agoq {

/// Owns one host buffer laid out by make_layout (sections aligned to section_alignment) and
/// hands out views of it. Zero-initialised. Movable, not copyable (copy with `clone`).
class quantized_tensor {
 public:
  /// An empty 0x0 tensor of the default spec.
  quantized_tensor() : quantized_tensor(agoq::spec{}, 0, 0) {}

  /// Allocates a zeroed [rows, cols] tensor for `s`. Throws agoq::invalid_argument for an
  /// invalid spec or negative extents, std::bad_alloc when memory runs out.
  quantized_tensor(agoq::spec const& s, std::int64_t rows, std::int64_t cols)
      : layout_(make_layout(s, rows, cols)), spec_(s), data_(allocate(layout_.total_bytes)) {
    if (layout_.total_bytes > 0) std::memset(data_.get(), 0, layout_.total_bytes);
  }

  /// A deep copy.
  quantized_tensor clone() const {
    quantized_tensor t(spec_, layout_.rows, layout_.cols);
    if (layout_.total_bytes > 0) std::memcpy(t.data_.get(), data_.get(), layout_.total_bytes);
    return t;
  }

  agoq::spec const& spec() const noexcept { return spec_; }
  quantized_layout const& layout() const noexcept { return layout_; }
  std::int64_t rows() const noexcept { return layout_.rows; }
  std::int64_t cols() const noexcept { return layout_.cols; }
  /// Bytes of the whole buffer (codes, scales, zero points and alignment padding).
  std::int64_t bytes() const noexcept { return layout_.total_bytes; }
  std::uint8_t* data() noexcept { return data_.get(); }
  std::uint8_t const* data() const noexcept { return data_.get(); }

  quantized_view view() { return view_of_buffer(spec_, rows(), cols(), data_.get()); }
  const_quantized_view view() const {
    return view_of_buffer(spec_, rows(), cols(), static_cast<std::uint8_t const*>(data_.get()));
  }

 private:
  struct aligned_delete {
    void operator()(std::uint8_t* p) const noexcept {
      ::operator delete[](p, std::align_val_t{section_alignment});
    }
  };
  using buffer = std::unique_ptr<std::uint8_t[], aligned_delete>;
  static buffer allocate(std::int64_t n) {
    if (n == 0) return nullptr;
    return buffer(static_cast<std::uint8_t*>(
        ::operator new[](static_cast<std::size_t>(n), std::align_val_t{section_alignment})));
  }

  quantized_layout layout_;
  agoq::spec spec_;
  buffer data_;
};

}  // namespace agoq
