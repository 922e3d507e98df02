// Stream priority names (kernels/device_stream.hpp), in every build: the server parses its
// --stream-priority flag whether or not CUDA is built in.
#include <string>

#include "core/error.hpp"
#include "kernels/device_stream.hpp"

namespace muon {

StreamPriority parse_stream_priority(std::string_view name) {
  if (name == "normal") return StreamPriority::normal;
  if (name == "low") return StreamPriority::low;
  if (name == "high") return StreamPriority::high;
  throw InvalidArgument("unknown stream priority '" + std::string(name) +
                        "' (known: normal, low, high)");
}

}  // namespace muon
