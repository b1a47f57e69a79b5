#include "controller/state_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"

namespace fusionrl {
namespace {

constexpr size_t kHeader = 8;
// A record longer than this is damage, not data (the controller's state is
// kilobytes to a few megabytes).
constexpr uint32_t kMaxRecord = 1u << 30;

uint32_t Mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("state journal: cannot write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// The whole file, or "" when it does not exist.
absl::StatusOr<std::string> ReadIfExists(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::string();
    return Errno("state journal: cannot open", path);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = Errno("state journal: cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("state journal: cannot open directory", dir);
  const int rc = ::fsync(fd);
  absl::Status s =
      rc == 0 ? absl::OkStatus() : Errno("state journal: cannot sync", dir);
  ::close(fd);
  return s;
}

}  // namespace

namespace internal {

std::string FrameRecord(absl::string_view payload) {
  std::string out;
  out.reserve(kHeader + payload.size());
  PutU32(out, static_cast<uint32_t>(payload.size()));
  PutU32(out, Mask(Crc32c(payload)));
  out.append(payload.data(), payload.size());
  return out;
}

std::vector<std::string> ReadFramedRecords(absl::string_view data,
                                           int64_t* good_bytes,
                                           std::string* error) {
  std::vector<std::string> out;
  size_t at = 0;
  error->clear();
  while (at < data.size()) {
    if (data.size() - at < kHeader) {
      *error = absl::StrCat("a record header cut short at byte ", at, " (",
                            data.size() - at, " of 8 bytes)");
      break;
    }
    const uint32_t length = GetU32(data.data() + at);
    const uint32_t crc = GetU32(data.data() + at + 4);
    if (length > kMaxRecord) {
      *error =
          absl::StrCat("a record at byte ", at, " claims ", length, " bytes");
      break;
    }
    if (data.size() - at - kHeader < length) {
      *error =
          absl::StrCat("a record at byte ", at, " cut short (",
                       data.size() - at - kHeader, " of ", length, " bytes)");
      break;
    }
    const absl::string_view payload = data.substr(at + kHeader, length);
    if (Mask(Crc32c(payload)) != crc) {
      *error = absl::StrCat("the record at byte ", at, " (", length,
                            " bytes) fails its CRC-32C");
      break;
    }
    out.emplace_back(payload);
    at += kHeader + length;
  }
  *good_bytes = static_cast<int64_t>(at);
  return out;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<StateJournal>> StateJournal::Open(
    const std::string& dir, Loaded* loaded) {
  *loaded = Loaded();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--state-dir: cannot create '", dir, "': ", ec.message()));
  }
  const std::string snapshot_path = dir + "/snapshot";
  absl::StatusOr<std::string> snapshot = ReadIfExists(snapshot_path);
  if (!snapshot.ok()) return snapshot.status();
  if (!snapshot->empty()) {
    int64_t good = 0;
    std::string error;
    std::vector<std::string> records =
        internal::ReadFramedRecords(*snapshot, &good, &error);
    if (records.size() != 1 || !error.empty() ||
        good != static_cast<int64_t>(snapshot->size())) {
      return absl::DataLossError(absl::StrCat(
          "state snapshot '", snapshot_path, "' is damaged (",
          error.empty() ? absl::StrCat(records.size(), " records, want 1")
                        : error,
          "); it was written atomically, so this is lost data: restore the "
          "directory from a backup or start without it"));
    }
    loaded->has_snapshot = true;
    loaded->snapshot = std::move(records[0]);
  }
  const std::string journal_path = dir + "/journal";
  absl::StatusOr<std::string> journal = ReadIfExists(journal_path);
  if (!journal.ok()) return journal.status();
  int64_t good = 0;
  std::string error;
  loaded->records = internal::ReadFramedRecords(*journal, &good, &error);
  if (!error.empty()) {
    loaded->warning = absl::StrCat(
        "state journal '", journal_path, "': ", error, "; starting from the ",
        loaded->records.size(), " good record(s) before it (",
        static_cast<int64_t>(journal->size()) - good, " byte(s) dropped)");
    if (::truncate(journal_path.c_str(), good) != 0) {
      return Errno("state journal: cannot truncate", journal_path);
    }
  }
  const int fd = ::open(journal_path.c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("state journal: cannot open", journal_path);
  if (absl::Status s = SyncDir(dir); !s.ok()) {
    ::close(fd);
    return s;
  }
  return std::unique_ptr<StateJournal>(new StateJournal(dir, fd, good));
}

StateJournal::~StateJournal() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status StateJournal::Append(const std::vector<std::string>& records) {
  if (records.empty()) return absl::OkStatus();
  std::string data;
  for (const std::string& r : records) data += internal::FrameRecord(r);
  const std::string path = dir_ + "/journal";
  if (absl::Status s = WriteAll(fd_, data, path); !s.ok()) return s;
  if (::fdatasync(fd_) != 0) return Errno("state journal: cannot sync", path);
  journal_bytes_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::Status StateJournal::Compact(absl::string_view snapshot) {
  const std::string path = dir_ + "/snapshot";
  const std::string tmp = path + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("state journal: cannot create", tmp);
  absl::Status s = WriteAll(fd, internal::FrameRecord(snapshot), tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("state journal: cannot sync", tmp);
  ::close(fd);
  if (!s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Errno("state journal: cannot rename onto", path);
  }
  if (absl::Status d = SyncDir(dir_); !d.ok()) return d;
  // The snapshot holds every journal record now: start the journal afresh.
  const std::string journal_path = dir_ + "/journal";
  if (::ftruncate(fd_, 0) != 0) {
    return Errno("state journal: cannot truncate", journal_path);
  }
  if (::fdatasync(fd_) != 0) {
    return Errno("state journal: cannot sync", journal_path);
  }
  journal_bytes_ = 0;
  return absl::OkStatus();
}

}  // namespace fusionrl
