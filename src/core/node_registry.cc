#include "core/node_registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace fusionrl {
namespace {

constexpr absl::string_view kIdPrefix = "node-";
constexpr size_t kMaxCards = 1024;
constexpr size_t kMaxSuperNodeName = 64;

std::string MakeId(uint64_t number) { return absl::StrCat(kIdPrefix, number); }

// n of "node-<n>" (canonical spelling only: no sign, no leading zeros).
std::optional<uint64_t> ParseId(absl::string_view id) {
  if (id.substr(0, kIdPrefix.size()) != kIdPrefix) return std::nullopt;
  const absl::string_view digits = id.substr(kIdPrefix.size());
  if (digits.empty() || digits.size() > 20 || digits[0] == '0') {
    return std::nullopt;
  }
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
  }
  uint64_t n;
  if (!absl::SimpleAtoi(digits, &n)) return std::nullopt;
  return n;
}

bool IsSuperNodeName(absl::string_view s) {
  if (s.empty() || s.size() > kMaxSuperNodeName) return false;
  for (char c : s) {
    const bool ok = absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status ValidateSpec(const NodeSpec& spec) {
  if (spec.host.empty()) {
    return absl::InvalidArgumentError("host: must not be empty");
  }
  if (spec.super_node.empty()) {
    return absl::InvalidArgumentError("super_node: must not be empty");
  }
  if (!IsSuperNodeName(spec.super_node)) {
    return absl::InvalidArgumentError(
        absl::StrCat("super_node: must match [A-Za-z0-9._-]{1,64}, got '",
                     absl::CHexEscape(spec.super_node.substr(0, 80)), "'"));
  }
  if (spec.host_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_memory_bytes: must be >= 0, got ", spec.host_memory_bytes));
  }
  if (spec.cards.empty() || spec.cards.size() > kMaxCards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cards: must list 1..", kMaxCards, " cards, got ", spec.cards.size()));
  }
  absl::flat_hash_set<int> seen;
  for (size_t i = 0; i < spec.cards.size(); ++i) {
    const CardSpec& card = spec.cards[i];
    const std::string field = absl::StrCat("cards[", i, "].");
    if (card.index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "index: must be >= 0, got ", card.index));
    }
    if (!seen.insert(card.index).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "index: duplicate card index ", card.index));
    }
    if (card.device.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "device: must not be empty"));
    }
    if (card.memory_bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "memory_bytes: must be >= 0, got ", card.memory_bytes));
    }
  }
  return absl::OkStatus();
}

std::string FormatUtc(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

}  // namespace

absl::string_view NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kAlive:
      return "alive";
    case NodeState::kLost:
      return "lost";
  }
  return "unknown";
}

bool NodeIdLess(absl::string_view a, absl::string_view b) {
  const std::optional<uint64_t> na = ParseId(a);
  const std::optional<uint64_t> nb = ParseId(b);
  if (na && nb) return *na < *nb;
  if (na.has_value() != nb.has_value()) return na.has_value();
  return a < b;
}

NodeRegistry::NodeRegistry(const Clock& clock, absl::Duration heartbeat_timeout)
    : clock_(clock), heartbeat_timeout_(heartbeat_timeout) {
  if (heartbeat_timeout <= absl::ZeroDuration()) {  // a broken invariant
    std::fprintf(stderr,
                 "NodeRegistry: heartbeat_timeout must be > 0, got %s\n",
                 absl::FormatDuration(heartbeat_timeout).c_str());
    std::abort();
  }
}

NodeView NodeRegistry::MakeView(uint64_t number, const Node& node,
                                absl::Time now) {
  NodeView view;
  view.id = MakeId(number);
  view.spec = node.spec;
  view.state = node.state;
  view.registered = node.registered;
  view.last_heartbeat = node.last_heartbeat;
  view.heartbeat_age = now - node.last_heartbeat;
  view.heartbeats = node.heartbeats;
  view.lost_at = node.lost_at;
  return view;
}

absl::StatusOr<std::string> NodeRegistry::Register(const NodeSpec& spec) {
  if (absl::Status status = ValidateSpec(spec); !status.ok()) return status;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  const uint64_t number = next_number_++;
  Node& node = nodes_[number];
  node.spec = spec;
  node.registered = now;
  node.last_heartbeat = now;
  ++alive_count_;
  return MakeId(number);
}

absl::Status NodeRegistry::Restore(uint64_t number, const NodeSpec& spec,
                                   bool lost, absl::Time registered,
                                   uint64_t next_number) {
  if (number == 0) {
    return absl::InvalidArgumentError("restoring a node: number 0");
  }
  if (absl::Status status = ValidateSpec(spec); !status.ok()) return status;
  absl::MutexLock lock(&mu_);
  if (nodes_.count(number) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("restoring ", MakeId(number), ": already known"));
  }
  const absl::Time now = clock_.Now();
  Node& node = nodes_[number];
  node.spec = spec;
  node.registered = registered;
  node.last_heartbeat = now;
  if (lost) {
    node.state = NodeState::kLost;
    node.lost_at = now;
  } else {
    ++alive_count_;
  }
  next_number_ = std::max({next_number_, number + 1, next_number});
  return absl::OkStatus();
}

uint64_t NodeRegistry::next_number() const {
  absl::MutexLock lock(&mu_);
  return next_number_;
}

std::optional<uint64_t> NodeRegistry::NumberOf(absl::string_view node_id) {
  return ParseId(node_id);
}

absl::Status NodeRegistry::Heartbeat(const std::string& node_id) {
  const std::optional<uint64_t> number = ParseId(node_id);
  absl::MutexLock lock(&mu_);
  auto it = number ? nodes_.find(*number) : nodes_.end();
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown node id '", absl::CHexEscape(node_id), "'; register first"));
  }
  Node& node = it->second;
  if (node.state == NodeState::kLost) {
    return absl::FailedPreconditionError(absl::StrCat(
        node_id, " was declared lost at ", FormatUtc(node.lost_at),
        " (no heartbeat for ",
        absl::FormatDuration(node.lost_at - node.last_heartbeat), ", timeout ",
        absl::FormatDuration(heartbeat_timeout_), "); register again"));
  }
  node.last_heartbeat = clock_.Now();
  ++node.heartbeats;
  return absl::OkStatus();
}

std::vector<std::string> NodeRegistry::SweepLost() {
  std::vector<std::string> lost;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  for (auto& [number, node] : nodes_) {
    if (node.state == NodeState::kAlive &&
        now - node.last_heartbeat > heartbeat_timeout_) {
      node.state = NodeState::kLost;
      node.lost_at = now;
      --alive_count_;
      lost.push_back(MakeId(number));
    }
  }
  return lost;
}

absl::Status NodeRegistry::Deregister(const std::string& node_id) {
  const std::optional<uint64_t> number = ParseId(node_id);
  absl::MutexLock lock(&mu_);
  auto it = number ? nodes_.find(*number) : nodes_.end();
  if (it == nodes_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown node id '", absl::CHexEscape(node_id), "'"));
  }
  if (it->second.state == NodeState::kAlive) --alive_count_;
  nodes_.erase(it);
  return absl::OkStatus();
}

std::optional<NodeView> NodeRegistry::Get(const std::string& node_id) const {
  const std::optional<uint64_t> number = ParseId(node_id);
  if (!number) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(*number);
  if (it == nodes_.end()) return std::nullopt;
  return MakeView(it->first, it->second, clock_.Now());
}

std::vector<NodeView> NodeRegistry::List() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  std::vector<NodeView> views;
  views.reserve(nodes_.size());
  for (const auto& [number, node] : nodes_) {
    views.push_back(MakeView(number, node, now));
  }
  return views;
}

int NodeRegistry::alive_count() const {
  absl::MutexLock lock(&mu_);
  return alive_count_;
}

std::string NodeRegistry::DebugString() const {
  std::string out;
  for (const NodeView& v : List()) {
    absl::StrAppend(&out, v.id, " ", NodeStateName(v.state),
                    " host=", v.spec.host, " super_node=", v.spec.super_node,
                    " cards=", v.spec.cards.size(),
                    " heartbeat_age=", absl::FormatDuration(v.heartbeat_age),
                    " heartbeats=", v.heartbeats, "\n");
  }
  return out;
}

}  // namespace fusionrl
