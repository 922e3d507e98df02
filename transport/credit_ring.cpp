#include "transport/credit_ring.hpp"

#include <algorithm>

namespace muon::transport {

void CreditRing::assign(uint32_t slots) {
  held_.assign(slots, false);
  words_.reset();
  announced_.clear();
}

void CreditRing::use_segment(ShmCreditWords words) {
  announced_.assign(held_.size(), 0);
  words_ = words;
}

void CreditRing::read_back() {
  if (!words_) return;
  const uint32_t n = std::min(size(), words_->slots());
  for (uint32_t i = 0; i < n; ++i) {
    if (held_[i] && words_->released(i) >= announced_[i]) held_[i] = false;
  }
}

std::optional<uint32_t> CreditRing::acquire() {
  auto it = std::find(held_.begin(), held_.end(), false);
  if (it == held_.end()) {
    read_back();
    it = std::find(held_.begin(), held_.end(), false);
    if (it == held_.end()) return std::nullopt;
  }
  *it = true;
  const auto slot = static_cast<uint32_t>(it - held_.begin());
  if (words_) ++announced_[slot];
  return slot;
}

bool CreditRing::release(uint32_t slot) {
  if (words_ || !held(slot)) return false;
  held_[slot] = false;
  return true;
}

bool CreditRing::give_back(uint32_t slot) {
  if (!held(slot)) return false;
  held_[slot] = false;
  if (words_) --announced_[slot];
  return true;
}

template <class Done>
bool CreditRing::ask(IfNot if_not, Done done) {
  if (done()) return true;
  if (!words_) return false;
  read_back();
  if (done()) return true;
  if (if_not == IfNot::stay_quiet) return false;
  words_->ask_wake();  // then read again: a release between the two reads is not missed
  read_back();
  return done();
}

bool CreditRing::any_free(IfNot if_not) {
  return ask(if_not, [&] { return std::find(held_.begin(), held_.end(), false) != held_.end(); });
}

bool CreditRing::all_free(IfNot if_not) {
  return ask(if_not, [&] { return std::find(held_.begin(), held_.end(), true) == held_.end(); });
}

}  // namespace muon::transport
