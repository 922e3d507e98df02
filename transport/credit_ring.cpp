#include "transport/credit_ring.hpp"

#include <algorithm>

namespace muon::transport {

void CreditRing::assign(uint32_t slots) { held_.assign(slots, false); }

std::optional<uint32_t> CreditRing::acquire() {
  const auto it = std::find(held_.begin(), held_.end(), false);
  if (it == held_.end()) return std::nullopt;
  *it = true;
  return static_cast<uint32_t>(it - held_.begin());
}

bool CreditRing::release(uint32_t slot) {
  if (!held(slot)) return false;
  held_[slot] = false;
  return true;
}

bool CreditRing::any_free() const {
  return std::find(held_.begin(), held_.end(), false) != held_.end();
}

bool CreditRing::all_free() const {
  return std::find(held_.begin(), held_.end(), true) == held_.end();
}

}  // namespace muon::transport
