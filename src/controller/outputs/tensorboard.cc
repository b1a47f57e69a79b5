#include "controller/outputs/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"

namespace fusionrl {
namespace {

constexpr char kFileVersion[] = "brain.Event:2";

// Protobuf wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// Field numbers (see the header for where they come from).
constexpr uint32_t kEventWallTime = 1;     // double
constexpr uint32_t kEventStep = 2;         // int64
constexpr uint32_t kEventFileVersion = 3;  // string
constexpr uint32_t kEventSummary = 5;      // Summary
constexpr uint32_t kSummaryValue = 1;      // repeated Summary.Value
constexpr uint32_t kValueTag = 1;          // string
constexpr uint32_t kValueSimpleValue = 2;  // float

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void PutKey(std::string& out, uint32_t field, uint32_t wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

void PutFixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void PutFixed64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void PutBytes(std::string& out, uint32_t field, absl::string_view bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

// Event.wall_time and Event.step, each left out when it holds its default
// (as proto3 serializers do; -0.0 is not the default and is kept).
void PutWallTimeAndStep(std::string& out, double wall_time, int64_t step) {
  uint64_t bits;
  std::memcpy(&bits, &wall_time, sizeof(bits));
  if (bits != 0) {
    PutKey(out, kEventWallTime, kFixed64);
    PutFixed64(out, bits);
  }
  if (step != 0) {
    PutKey(out, kEventStep, kVarint);
    // int64 is the two's complement as a 64-bit varint (10 bytes if < 0).
    PutVarint(out, static_cast<uint64_t>(step));
  }
}

// `v` rounded to float; +-inf beyond float's range (a plain conversion of
// an out-of-range double is undefined behaviour in C++).
float ToFloat(double v) {
  if (std::isfinite(v) && std::fabs(v) > static_cast<double>(FLT_MAX)) {
    return v > 0 ? HUGE_VALF : -HUGE_VALF;
  }
  return static_cast<float>(v);
}

absl::Status InvalidWallTime(double wall_time) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensorboard: wall time ", wall_time,
                   " is not finite seconds since the epoch"));
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') {
    return "localhost";
  }
  std::string host(buf);
  // A file name, not a path: no separators.
  for (char& c : host) {
    if (c == '/') c = '_';
  }
  return host;
}

}  // namespace

namespace internal {

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameTfRecord(absl::string_view payload) {
  std::string out;
  out.reserve(8 + 4 + payload.size() + 4);
  PutFixed64(out, payload.size());
  PutFixed32(out, MaskedCrc32c(absl::string_view(out.data(), 8)));
  out.append(payload.data(), payload.size());
  PutFixed32(out, MaskedCrc32c(payload));
  return out;
}

std::string EncodeFileVersionEvent(double wall_time_seconds,
                                   absl::string_view file_version) {
  std::string event;
  PutWallTimeAndStep(event, wall_time_seconds, 0);
  PutBytes(event, kEventFileVersion, file_version);
  return event;
}

std::string EncodeScalarsEvent(
    int64_t step, double wall_time_seconds,
    const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  std::string value;
  for (const auto& [tag, v] : scalars) {
    value.clear();
    PutBytes(value, kValueTag, tag);
    PutKey(value, kValueSimpleValue, kFixed32);
    const float f = ToFloat(v);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    PutFixed32(value, bits);
    PutBytes(summary, kSummaryValue, value);
  }
  std::string event;
  PutWallTimeAndStep(event, wall_time_seconds, step);
  // A set message field is written even when empty.
  PutBytes(event, kEventSummary, summary);
  return event;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(
    const std::string& dir, double wall_time_seconds) {
  if (!std::isfinite(wall_time_seconds) || wall_time_seconds < 0) {
    return InvalidWallTime(wall_time_seconds);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensorboard: cannot create directory '", dir, "': ", ec.message()));
  }
  const std::string stem =
      absl::StrCat(dir, "/events.out.tfevents.",
                   static_cast<int64_t>(wall_time_seconds), ".", Hostname());
  // "x": create, never clobber another writer's file (two writers opened in
  // the same second, e.g. a job resumed at once into the same directory).
  constexpr int kMaxTries = 100;
  std::string path;
  std::FILE* file = nullptr;
  for (int n = 0; n < kMaxTries && file == nullptr; ++n) {
    path = n == 0 ? absl::StrCat(stem, ".fusionrl")
                  : absl::StrCat(stem, ".", n, ".fusionrl");
    file = std::fopen(path.c_str(), "wbxe");
    if (file == nullptr && errno != EEXIST) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensorboard: cannot create event file '", path,
                       "': ", std::strerror(errno)));
    }
  }
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensorboard: cannot create an event file in '", dir,
                     "': ", kMaxTries, " names taken, up to '", path, "'"));
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, file));
  absl::Status s = writer->WriteRecord(internal::FrameTfRecord(
      internal::EncodeFileVersionEvent(wall_time_seconds, kFileVersion)));
  if (!s.ok()) {
    writer.reset();
    std::remove(path.c_str());  // no file without its file_version
    return s;
  }
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status TensorBoardWriter::WriteScalars(
    int64_t step, double wall_time_seconds,
    const std::vector<std::pair<std::string, double>>& scalars) {
  if (!std::isfinite(wall_time_seconds)) {
    return InvalidWallTime(wall_time_seconds);
  }
  return WriteRecord(internal::FrameTfRecord(
      internal::EncodeScalarsEvent(step, wall_time_seconds, scalars)));
}

absl::Status TensorBoardWriter::Flush() {
  if (!failed_.ok()) return failed_;
  if (std::fflush(file_) != 0) {
    failed_ = absl::InternalError(absl::StrCat(
        "tensorboard: cannot flush '", path_, "': ", std::strerror(errno)));
    return failed_;
  }
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::WriteRecord(const std::string& record) {
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensorboard: not writing to '", path_,
                     "' after an earlier error: ", failed_.message()));
  }
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    failed_ = absl::InternalError(absl::StrCat(
        "tensorboard: cannot write '", path_, "': ", std::strerror(errno)));
    return failed_;
  }
  return Flush();
}

}  // namespace fusionrl
