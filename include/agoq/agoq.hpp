/// \file
/// Everything of agoq that a host compiler builds: schemes, layouts, and the CPU executor.
#pragma once

#include "config.hpp"
#include "error.hpp"
#include "layout/layout.hpp"
#include "layout/matrix.hpp"
#include "layout/tensor.hpp"
#include "layout/view.hpp"
#include "numeric/codec.hpp"
#include "numeric/codes.hpp"
#include "numeric/element.hpp"
#include "numeric/fp8.hpp"
#include "numeric/philox.hpp"
#include "numeric/rounding.hpp"
#include "numeric/scale.hpp"
#include "quantize.hpp"
#include "scheme/dispatch.hpp"
#include "scheme/grouping.hpp"
#include "scheme/scheme.hpp"
#include "scheme/spec.hpp"
#include "version.hpp"
