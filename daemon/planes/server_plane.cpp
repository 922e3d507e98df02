#include "daemon/planes/server_plane.hpp"

#include "core/error.hpp"

namespace muon::daemon {

AfterFrame ServerPlane::write_update(uint32_t, const DeviceParamState&, int64_t, int64_t,
                                     transport::DType) {
  throw InvalidArgument(std::string("the ") + transport::data_plane_name(kind()) +
                        " data plane takes no device update: send its bytes (write_host)");
}

std::byte* ServerPlane::host_result_slot(uint32_t) {
  throw InvalidArgument(std::string("the ") + transport::data_plane_name(kind()) +
                        " data plane's result slots are not host memory: send the bytes "
                        "(write_host)");
}

}  // namespace muon::daemon
