#include "daemon/parameter.hpp"

#include "daemon/scheduler.hpp"

namespace muon::daemon {

bool same_spec(const ParameterSpec& a, const ParameterSpec& b) {
  return a.name == b.name && a.shape.batch == b.shape.batch && a.shape.rows == b.shape.rows &&
         a.shape.cols == b.shape.cols && a.grad_dtype == b.grad_dtype &&
         a.update_dtype == b.update_dtype && same_options(a.options, b.options);
}

int64_t total_elements(const std::vector<Range>& ranges) {
  int64_t n = 0;
  for (const auto& r : ranges) n += r.size();
  return n;
}

}  // namespace muon::daemon
