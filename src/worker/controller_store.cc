#include "worker/controller_store.h"

#include <chrono>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fusionrl {
namespace {

// c10d's Store interface over the controller's rendezvous store, for one
// generation of one job. c10d reports errors as exceptions: a failed call
// throws std::runtime_error with the controller's message (Gloo's
// rendezvous then fails, and FormCrossNodeGroup returns it as a status).
class ControllerStore final : public c10d::Store {
 public:
  ControllerStore(WorkClient* client, std::string job_id, std::string node_id,
                  int64_t generation, absl::Duration timeout)
      : c10d::Store(
            std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout))),
        client_(client) {
    base_.job_id = std::move(job_id);
    base_.node_id = std::move(node_id);
    base_.generation = generation;
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    StoreCall c = Call(StoreOp::kSet, key);
    c.value = Text(value);
    Run(c);
  }

  std::vector<uint8_t> compareSet(
      const std::string& key, const std::vector<uint8_t>& expected,
      const std::vector<uint8_t>& desired) override {
    StoreCall c = Call(StoreOp::kCompareSet, key);
    c.expected = Text(expected);
    c.value = Text(desired);
    return Bytes(Run(c).value);
  }

  std::vector<uint8_t> get(const std::string& key) override {
    return Bytes(Run(Call(StoreOp::kGet, key)).value);
  }

  int64_t add(const std::string& key, int64_t value) override {
    StoreCall c = Call(StoreOp::kAdd, key);
    c.delta = value;
    return Run(c).number;
  }

  bool deleteKey(const std::string& key) override {
    return Run(Call(StoreOp::kDelete, key)).flag;
  }

  bool check(const std::vector<std::string>& keys) override {
    StoreCall c = Call(StoreOp::kCheck, "");
    c.keys = keys;
    return Run(c).flag;
  }

  int64_t getNumKeys() override {
    throw std::runtime_error(
        "the controller's rendezvous store does not count keys");
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    StoreCall c = Call(StoreOp::kWait, "");
    c.keys = keys;
    Run(c, absl::Milliseconds(timeout.count()));
  }

  // Whether the generation is still current (the probe of the group's
  // collectives).
  absl::Status Probe() {
    StoreCall c = base_;
    c.op = StoreOp::kCheck;
    c.keys = {"probe"};
    return client_->Store(c, absl::Seconds(10)).status();
  }

 private:
  StoreCall Call(StoreOp op, const std::string& key) const {
    StoreCall c = base_;
    c.op = op;
    if (!key.empty()) c.keys = {key};
    return c;
  }

  StoreReply Run(const StoreCall& c) {
    return Run(c, absl::Milliseconds(timeout_.count()));
  }

  StoreReply Run(const StoreCall& c, absl::Duration timeout) {
    absl::StatusOr<StoreReply> r = client_->Store(c, timeout);
    if (!r.ok()) {
      throw std::runtime_error(
          absl::StrCat("rendezvous store of ", base_.job_id, " generation ",
                       base_.generation, ": ", r.status().ToString()));
    }
    return *std::move(r);
  }

  static std::string Text(const std::vector<uint8_t>& v) {
    return std::string(v.begin(), v.end());
  }
  static std::vector<uint8_t> Bytes(const std::string& s) {
    return std::vector<uint8_t>(s.begin(), s.end());
  }

  WorkClient* client_;
  StoreCall base_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GradientSync>> FormCrossNodeGroup(
    WorkClient* client, const std::string& job_id, const std::string& node_id,
    int64_t generation, int rank, int nodes, absl::Duration timeout) {
  auto store = c10::make_intrusive<ControllerStore>(client, job_id, node_id,
                                                    generation, timeout);
  auto probe = [store] { return store->Probe(); };
  return MakeStoreGlooGroup(c10::intrusive_ptr<c10d::Store>(store), rank, nodes,
                            timeout, std::move(probe));
}

absl::StatusOr<std::unique_ptr<GradientSync>> FormJobGroup(
    WorkClient* client, const std::string& job_id, const std::string& node_id,
    const std::string& name, int rank, int size, absl::Duration timeout) {
  auto store = c10::make_intrusive<ControllerStore>(
      client, job_id, node_id, kJobRendezvousScope, timeout);
  auto probe = [store] { return store->Probe(); };
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      name, c10::intrusive_ptr<c10d::Store>(store));
  return MakeStoreGlooGroup(c10::intrusive_ptr<c10d::Store>(prefixed), rank,
                            size, timeout, std::move(probe));
}

}  // namespace fusionrl
