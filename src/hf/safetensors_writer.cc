// Safetensors writing: single files (atomic, deterministic), sharded
// checkpoints with their index, and reading that index.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"
#include "hf/safetensors.h"
#include "hf/safetensors_internal.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using hf_internal::Av;
using hf_internal::ByteSize;
using hf_internal::ErrnoError;
using hf_internal::FileDescriptor;
using hf_internal::IsValidUtf8;
using hf_internal::JsonGuard;
using hf_internal::kMetadataKey;
using hf_internal::ParseJson;
using hf_internal::Printable;
using hf_internal::ShapeString;
using Json = nlohmann::json;

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteAll(int fd, const void* data, size_t n,
                      const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "write failed");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

struct Piece {
  const void* data;
  size_t size;
};

// Writes `pieces` to path.tmp, fsyncs, renames over `path`, fsyncs the
// directory (best effort). Removes path.tmp on failure.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<Piece>& pieces) {
  const std::string tmp = path + ".tmp";
  FileDescriptor fd(
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoError(errno, tmp, "cannot create");
  absl::Status status;
  for (const Piece& piece : pieces) {
    status = WriteAll(fd.get(), piece.data, piece.size, tmp);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd.get()) != 0) {
    status = ErrnoError(errno, tmp, "fsync failed");
  }
  const int close_err = fd.Close();
  if (status.ok() && close_err != 0) {
    status = ErrnoError(close_err, tmp, "close failed");
  }
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, path,
                        absl::StrCat("cannot rename ", tmp, " over it"));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // Make the rename durable. Best effort: some filesystems refuse fsync on a
  // directory, and the file itself is already complete.
  FileDescriptor dir(
      ::open(DirName(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, path, "cannot open");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, path, "fstat");
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t r = ::read(fd.get(), buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "read failed");
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

// Checks every view and the metadata (messages name the tensor).
absl::Status ValidateViews(const std::vector<StTensorView>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const StTensorView& t : tensors) {
    const std::string where =
        absl::StrCat("tensor '", Printable(t.name), "': ");
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "the name is reserved for the metadata"));
    }
    if (!IsValidUtf8(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "the name is not valid UTF-8"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "duplicate tensor name"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "shape ", ShapeString(t.shape), " has a negative dim"));
      }
    }
    uint64_t numel, needed;
    if (!ByteSize(t.shape, StDtypeSize(t.dtype), &numel, &needed)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "shape ", ShapeString(t.shape), " of ",
          Av(StDtypeName(t.dtype)), " overflows 64-bit byte size"));
    }
    if (t.bytes != needed) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, t.bytes, " bytes given but shape ", ShapeString(t.shape),
          " of ", Av(StDtypeName(t.dtype)), " needs ", needed));
    }
    if (t.bytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "data is null but ", t.bytes, " bytes given"));
    }
  }
  for (const auto& [k, v] : metadata) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata key '", Printable(k, false),
                       "': key or value is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

// The padded header of already validated views.
absl::StatusOr<std::string> BuildHeader(
    const std::vector<StTensorView>& tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;  // sorted: std::map
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const StTensorView& t : tensors) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(Av(StDtypeName(t.dtype)));
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.bytes};
    header[t.name] = std::move(entry);
    offset += t.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // validated: not expected
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serialize header: ", e.what()));
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  return text;
}

}  // namespace

// ---------------------------------------------------------------------------
// Writing.

absl::Status WriteSafetensors(
    const std::string& path, const std::vector<StTensorView>& tensors,
    const std::map<std::string, std::string>& metadata) {
  absl::Status valid = ValidateViews(tensors, metadata);
  if (!valid.ok()) {
    return absl::Status(valid.code(),
                        absl::StrCat(path, ": ", valid.message()));
  }
  FUSIONRL_ASSIGN_OR_RETURN(const std::string header,
                            BuildHeader(tensors, metadata));
  const uint64_t n = header.size();
  uint8_t length[8];
  std::memcpy(length, &n, 8);  // little-endian host
  std::vector<Piece> pieces;
  pieces.reserve(tensors.size() + 2);
  pieces.push_back({length, 8});
  pieces.push_back({header.data(), header.size()});
  for (const StTensorView& t : tensors) {
    if (t.bytes > 0) pieces.push_back({t.data, t.bytes});
  }
  return WriteFileAtomically(path, pieces);
}

absl::StatusOr<std::vector<std::string>> WriteShardedSafetensors(
    const std::string& dir, const std::vector<StTensorView>& tensors,
    const std::map<std::string, std::string>& metadata,
    uint64_t max_shard_bytes, const std::string& base_name) {
  if (max_shard_bytes == 0) {
    return absl::InvalidArgumentError("max_shard_bytes must be positive");
  }
  absl::Status valid = ValidateViews(tensors, metadata);
  if (!valid.ok()) {
    return absl::Status(
        valid.code(),
        absl::StrCat(dir, "/", base_name, "*.safetensors: ", valid.message()));
  }
  // Greedy, order-preserving: a shard closes when the next tensor would push
  // it past the limit; a tensor above the limit is a shard by itself.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t b = tensors[i].bytes;
    total_bytes += b;
    if (!current.empty() &&
        (b > max_shard_bytes || current_bytes + b > max_shard_bytes)) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += b;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  if (shards.size() == 1) {
    std::string path = absl::StrCat(dir, "/", base_name, ".safetensors");
    FUSIONRL_RETURN_IF_ERROR(WriteSafetensors(path, tensors, metadata));
    return std::vector<std::string>{std::move(path)};
  }

  std::vector<std::string> written;
  Json weight_map = Json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = absl::StrFormat("%s-%05d-of-%05d.safetensors",
                                             base_name, s + 1, shards.size());
    std::vector<StTensorView> views;
    views.reserve(shards[s].size());
    for (size_t i : shards[s]) {
      views.push_back(tensors[i]);
      weight_map[tensors[i].name] = file;
    }
    std::string path = absl::StrCat(dir, "/", file);
    FUSIONRL_RETURN_IF_ERROR(WriteSafetensors(path, views, metadata));
    written.push_back(std::move(path));
  }
  Json index = Json::object();
  index["metadata"] = Json{{"total_size", total_bytes}};
  index["weight_map"] = std::move(weight_map);
  // json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers.
  const std::string text = index.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
  std::string index_path =
      absl::StrCat(dir, "/", base_name, ".safetensors.index.json");
  FUSIONRL_RETURN_IF_ERROR(
      WriteFileAtomically(index_path, {{text.data(), text.size()}}));
  written.push_back(std::move(index_path));
  return written;
}

absl::StatusOr<std::map<std::string, std::string>> ReadSafetensorsIndex(
    const std::string& index_path) {
  FUSIONRL_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(index_path));
  auto error = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", parts...));
  };
  JsonGuard guard;
  Json root;
  absl::Status parsed = ParseJson(text.data(), text.size(), &guard, &root);
  if (!parsed.ok()) return error("not valid JSON: ", parsed.message());
  if (guard.found) {
    return error("key '", Printable(guard.key), "' appears more than once");
  }
  if (!root.is_object()) {
    return error("is a JSON ", root.type_name(), ", not an object");
  }
  auto it = root.find("weight_map");
  if (it == root.end()) return error("missing 'weight_map'");
  if (!it->is_object()) {
    return error("'weight_map' is a JSON ", it->type_name(), ", not an object");
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : it->items()) {
    const std::string where =
        absl::StrCat("weight_map tensor '", Printable(name), "': ");
    if (!file.is_string()) {
      return error(where, "file is a JSON ", file.type_name(),
                   ", not a string");
    }
    const std::string& f = file.get_ref<const std::string&>();
    bool dot_dot = false;
    for (absl::string_view part : absl::StrSplit(f, '/')) {
      if (part == "..") dot_dot = true;
    }
    if (f.empty() || f[0] == '/' || dot_dot) {
      return error(where, "file '", Printable(f),
                   "' must be a relative path inside the checkpoint directory");
    }
    out[name] = f;
  }
  return out;
}

}  // namespace fusionrl
