#include <doctest/doctest.h>
#include <agoq/agoq.hpp>
