// ShmSegment: a server-created segment is fully allocated, mapped by a client that unlinks its
// name, shares its bytes both ways, and a segment the OS cannot hold fails with an error that
// names it and leaves nothing in /dev/shm.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.hpp"
#include "transport/shm_segment.hpp"

namespace {

using muon::transport::SegmentLayout;
using muon::transport::ShmSegment;

std::filesystem::path dev_shm(const std::string& name) { return "/dev/shm/" + name; }

TEST(ShmSegment, CreatedSegmentHasEveryPageAllocated) {
  const SegmentLayout layout{2, 3, 64 << 10};
  ShmSegment server = ShmSegment::create(layout);
  struct stat st {};
  ASSERT_EQ(::stat(dev_shm(server.name()).c_str(), &st), 0) << server.name();
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), layout.total_bytes());
  // st_blocks counts 512-byte units the file holds: every page, not a sparse file.
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, layout.total_bytes());
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ShmSegment::remove(server.name());
}

TEST(ShmSegment, ClientSharesBytesAndUnlinksTheName) {
  const SegmentLayout layout{2, 2, 4096};
  ShmSegment server = ShmSegment::create(layout);
  for (uint32_t i = 0; i < 2; ++i) {  // fresh pages read as zeros
    for (uint64_t b = 0; b < layout.slot_bytes; b += 512) {
      ASSERT_EQ(server.tx_slot(i)[b], std::byte{0});
      ASSERT_EQ(server.rx_slot(i)[b], std::byte{0});
    }
  }
  ShmSegment client = ShmSegment::open_and_unlink(server.name(), layout);
  EXPECT_FALSE(std::filesystem::exists(dev_shm(server.name())));
  std::memset(client.tx_slot(1), 0x5a, layout.slot_bytes);
  std::memset(server.rx_slot(0), 0xa5, layout.slot_bytes);
  EXPECT_EQ(server.tx_slot(1)[layout.slot_bytes - 1], std::byte{0x5a});
  EXPECT_EQ(server.tx_slot(0)[0], std::byte{0});
  EXPECT_EQ(client.rx_slot(0)[17], std::byte{0xa5});
  EXPECT_EQ(client.rx_slot(1)[17], std::byte{0});
  EXPECT_THROW(client.rx_slot(2), muon::InvalidArgument);
}

TEST(ShmSegment, FullDevShmFailsCleanly) {
  // A real full /dev/shm: a child in its own mount namespace mounts a 1 MiB tmpfs there and asks
  // for an 8 MiB segment. It reports through its exit code: 0 = the error named the segment and
  // said /dev/shm is full, and no file is left; 20 = no permission for the namespace (not root).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m,mode=1777") != 0) {
      ::_exit(20);
    }
    const SegmentLayout layout{4, 4, 1 << 20};
    try {
      ShmSegment::create(layout);
      ::_exit(11);
    } catch (const muon::Error& e) {
      const std::string what = e.what();
      if (what.find("cannot reserve " + std::to_string(layout.total_bytes()) +
                    " bytes for shared-memory segment 'muon-") ==
              std::string::npos ||
          what.find("/dev/shm is full") == std::string::npos) {
        std::fprintf(stderr, "unexpected message: %s\n", what.c_str());
        ::_exit(12);
      }
      ::_exit(std::filesystem::is_empty("/dev/shm") ? 0 : 13);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 20) GTEST_SKIP() << "no permission for a private mount namespace";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "11: no error, 12: message, 13: a file left behind";
}

TEST(ShmSegment, RejectsALayoutItCannotUse) {
  EXPECT_THROW(ShmSegment::create(SegmentLayout{0, 1, 4096}), muon::InvalidArgument);
  EXPECT_THROW(ShmSegment::create(SegmentLayout{1, 1, 100}), muon::InvalidArgument);
}

}  // namespace
