/// \file
/// A caller's thread pool for the tests of the host executor's threads: it runs the tasks on the
/// calling thread, last first, and counts the calls and tasks it was handed.
#pragma once

#include <agoq/host_executor.hpp>

#include <cstdint>

namespace host_test {

struct reverse_pool {
  int calls = 0;
  std::int64_t tasks = 0;
  static void run(void* self, std::int64_t n, agoq::host_task task) {
    auto* p = static_cast<reverse_pool*>(self);
    ++p->calls;
    p->tasks += n;
    for (std::int64_t i = n - 1; i >= 0; --i) task.run(task.context, i);
  }
  agoq::host_pool pool() { return {&run, this}; }
};

}  // namespace host_test
