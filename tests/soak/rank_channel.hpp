// The line protocol between the soak driver and its rank processes: the rank writes events to
// its stdout, the driver writes commands to the rank's stdin, one line each, words separated by
// spaces (a free-text message comes last).
//
// Events (rank -> driver):
//   segment <name>                     a shared-memory segment this rank mapped (/dev/shm name)
//   hello_retry <n>                    the server still saw the previous session of this rank
//   registered <ms>                    every parameter is registered (all ranks connected)
//   update <param> <step> <hash>       the update of (param index, step) arrived; XXH3-64 in hex
//   round <ms> <errors>                one round (push, commit, wait of every parameter) ended
//   error <code> <param> <step> <rank> <message>   a failed step (code from the server, or
//                                      "timeout" / "connection" from the client library)
//   recover                            this rank disconnected after a failed round; waits for go
//   done                               every parameter reached the target; waits for exit
//   fatal <message>                    the rank gives up (it exits non-zero)
// Commands (driver -> rank):
//   go                                 reconnect and resume (every rank of the job is back)
//   target <steps>                     stop after this many steps of every parameter
//   exit                               say goodbye and exit 0
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace muon::soak {

/// Splits `line` into at most `max_words` words; the last one keeps the rest of the line.
std::vector<std::string> split_words(const std::string& line, size_t max_words);

/// The rank's end: events to stdout (one write per line, so lines never interleave), commands
/// from stdin.
class RankChannel {
 public:
  void emit(const std::string& line);
  /// The next command line, waiting at most `timeout`; nullopt on timeout. Throws
  /// std::runtime_error when stdin is closed (the driver is gone).
  std::optional<std::string> next_command(std::chrono::milliseconds timeout);

 private:
  std::string pending_;
};

}  // namespace muon::soak
