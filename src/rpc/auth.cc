#include "rpc/auth.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace fusionrl::rpc {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

grpc::Status CheckAuth(const grpc::ServerContextBase& context,
                       const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthMetadataKey);
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata; "
                        "this controller requires its shared token");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer) ||
      !ConstantTimeEquals(value.substr(kBearer.size()), token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "wrong token in 'authorization' metadata");
  }
  return grpc::Status::OK;
}

void AttachToken(grpc::ClientContext& context, const std::string& token) {
  if (!token.empty()) {
    context.AddMetadata(kAuthMetadataKey, absl::StrCat(kBearer, token));
  }
}

absl::StatusOr<std::string> LoadToken(const std::string& file,
                                      const std::string& env) {
  std::string token;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("auth token file '", file, "' cannot be read"));
    }
    std::getline(in, token);
    token = std::string(absl::StripAsciiWhitespace(token));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth token file '", file, "' is empty"));
    }
    return token;
  }
  if (!env.empty()) {
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("auth token variable $", env, " is not set"));
    }
    token = std::string(absl::StripAsciiWhitespace(value));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth token variable $", env, " is empty"));
    }
  }
  return token;
}

}  // namespace fusionrl::rpc
