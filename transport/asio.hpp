// Boost.Asio, included the one way this project does: Boost 1.74's awaitable.hpp (Debian 12)
// uses std::exchange without including <utility>, which GCC 12 in C++20 mode rejects.
#pragma once

#include <utility>

#include <boost/asio.hpp>
