// The controller's table of worker nodes, their cards and their liveness.
#ifndef FUSIONRL_CORE_NODE_REGISTRY_H_
#define FUSIONRL_CORE_NODE_REGISTRY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace fusionrl {

// One accelerator card of a node, as the worker reports it.
struct CardSpec {
  int index = 0;             // the worker's card number, unique in the node
  std::string device;        // torch device string: "cuda:3", "cpu"
  int64_t memory_bytes = 0;  // card memory; 0 = unknown
};

// What a worker reports when it registers.
struct NodeSpec {
  std::string host;        // address or name, for humans and for transports
  std::string super_node;  // fast-interconnect group: [A-Za-z0-9._-]{1,64}
  std::vector<CardSpec> cards;    // 1..1024 cards
  int64_t host_memory_bytes = 0;  // host RAM; 0 = unknown
  std::string version;            // the worker's FusionRL version
};

// kAlive: registered and heard from within the timeout (as of the last
// SweepLost). kLost: declared lost by SweepLost; final for that id.
enum class NodeState { kAlive, kLost };

// "alive", "lost".
absl::string_view NodeStateName(NodeState state);

// A copy of one node's entry, taken under the registry's lock.
struct NodeView {
  std::string id;  // "node-<n>"
  NodeSpec spec;
  NodeState state = NodeState::kAlive;
  absl::Time registered;
  absl::Time last_heartbeat;     // registration counts as the first one
  absl::Duration heartbeat_age;  // clock.Now() - last_heartbeat, at the copy
  uint64_t heartbeats = 0;       // Heartbeat() calls accepted (not Register)
  absl::Time lost_at = absl::InfiniteFuture();  // when SweepLost declared it
};

// Orders node ids as the registry hands them out: "node-<n>" by n
// ("node-2" < "node-10"), and any other string after those, by bytes.
bool NodeIdLess(absl::string_view a, absl::string_view b);

// NodeRegistry: the controller's table of worker nodes and their cards.
//
// A worker calls Register() once with its NodeSpec and gets a new id
// "node-<n>" (n counts from 1 and is never reused, even after Deregister),
// then calls Heartbeat(id) periodically. The controller calls SweepLost()
// periodically; a node whose last heartbeat is strictly more than
// `heartbeat_timeout` old at that moment is declared lost, once. A lost node
// never comes back under the same id: its later heartbeats fail with
// FailedPrecondition and the worker must register again (and gets a new id),
// so whatever ran on the lost id can be re-queued without racing the old
// worker. Liveness changes only in SweepLost(): a late heartbeat that arrives
// before the sweep is accepted, since nothing was re-queued yet.
//
// Lost nodes stay listed (state kLost) until Deregister() forgets them, so
// status can show them and late heartbeats get a precise error.
//
// Ownership: the registry borrows `clock`, which must outlive it.
// Thread safety: thread-safe; every method takes one internal mutex and none
// calls out while holding it (the Clock is the only callee).
class NodeRegistry {
 public:
  // REQUIRES: heartbeat_timeout > absl::ZeroDuration().
  NodeRegistry(const Clock& clock, absl::Duration heartbeat_timeout);

  NodeRegistry(const NodeRegistry&) = delete;
  NodeRegistry& operator=(const NodeRegistry&) = delete;

  // Validates `spec` and adds it as a new alive node whose last heartbeat is
  // now. Returns the new id, or InvalidArgument naming the first bad field:
  // "cards[1].index: duplicate card index 0".
  absl::StatusOr<std::string> Register(const NodeSpec& spec);

  // Records a heartbeat. NotFound for an unknown (or deregistered) id;
  // FailedPrecondition for a node declared lost ("node-3 was declared lost
  // at ...; register again").
  absl::Status Heartbeat(const std::string& node_id);

  // Declares lost every alive node whose last heartbeat is strictly more than
  // the timeout before now, and returns their ids in id order. Each node is
  // returned by exactly one call.
  std::vector<std::string> SweepLost();

  // Forgets a node (clean shutdown, or a lost node the controller is done
  // with). NotFound if the id is unknown. The id is not reused.
  absl::Status Deregister(const std::string& node_id);

  // A copy of one node, or nullopt if unknown.
  std::optional<NodeView> Get(const std::string& node_id) const;

  // Every known node (alive and lost), in id order.
  std::vector<NodeView> List() const;

  int alive_count() const;
  absl::Duration heartbeat_timeout() const { return heartbeat_timeout_; }

  // Restoring a restarted controller's state (controller/controller_state.h):
  // adds node-<number> as it was, lost or alive; an alive one's last
  // heartbeat is now, so its worker has one timeout to be heard from again.
  // Ids below `next_number` are never handed out again. AlreadyExists if
  // the number is taken; InvalidArgument for a bad spec or number 0.
  absl::Status Restore(uint64_t number, const NodeSpec& spec, bool lost,
                       absl::Time registered, uint64_t next_number);
  uint64_t next_number() const;
  // n of "node-<n>", or nullopt for any other string.
  static std::optional<uint64_t> NumberOf(absl::string_view node_id);

  // One line per node, in id order, e.g.
  // "node-1 alive host=10.0.0.5 super_node=sn-a cards=8 heartbeat_age=1.5s
  //  heartbeats=12"; "" when empty.
  std::string DebugString() const;

 private:
  struct Node {
    NodeSpec spec;
    NodeState state = NodeState::kAlive;
    absl::Time registered;
    absl::Time last_heartbeat;
    uint64_t heartbeats = 0;
    absl::Time lost_at = absl::InfiniteFuture();
  };

  static NodeView MakeView(uint64_t number, const Node& node, absl::Time now);

  const Clock& clock_;
  const absl::Duration heartbeat_timeout_;

  mutable absl::Mutex mu_;
  // Keyed by n of "node-<n>", so iteration is id order.
  std::map<uint64_t, Node> nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
  int alive_count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_NODE_REGISTRY_H_
