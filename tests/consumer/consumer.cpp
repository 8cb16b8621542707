// A user program: quantizes a tensor with agoq and checks the round trip error bound.
#include <agoq/agoq.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  std::int64_t const rows = 4, cols = 300;
  std::vector<float> x(rows * cols);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  agoq::spec const s = agoq::spec::parse("int8_g128_sym_rne_f32");
  agoq::quantized_tensor q(s, rows, cols);
  agoq::quantize(agoq::host, agoq::matrix_view<float const>(x.data(), rows, cols), q.view());
  std::vector<float> y(x.size());
  agoq::dequantize(agoq::host, q.view(), agoq::matrix_view<float>(y.data(), rows, cols));
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::fmax(worst, std::fabs(x[i] - y[i]));
  std::printf("%s: %lld bytes for %lld floats, max error %.3g\n", s.name().c_str(),
              static_cast<long long>(q.bytes()), static_cast<long long>(rows * cols), worst);
  // |x| <= 1 gives scale <= 1/127 and an error of at most half a step.
  return worst <= 0.5 / 127 + 1e-7 ? 0 : 1;
}
