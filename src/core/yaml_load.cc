#include "core/yaml_load.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <cstdint>
#include <sstream>

namespace fusionrl {
namespace {

// Counts parser events and throws once there are more than `limit`.
class EventBudget : public YAML::EventHandler {
 public:
  explicit EventBudget(int64_t limit) : limit_(limit) {}

  void OnDocumentStart(const YAML::Mark& mark) override { Count(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Count(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Count(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Count(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&,
                       YAML::anchor_t, YAML::EmitterStyle::value) override {
    Count(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Count(mark);
  }
  void OnMapEnd() override {}

 private:
  void Count(const YAML::Mark& mark) {
    if (++events_ > limit_) {
      throw YAML::ParserException(
          mark,
          "the YAML parser stops making progress here (a ',' outside "
          "[ ] or { } does this); remove or quote it");
    }
  }

  const int64_t limit_;
  int64_t events_ = 0;
};

}  // namespace

std::vector<YAML::Node> LoadAllYaml(const std::string& text) {
  // Every event of a well-formed text comes with a token of at least one
  // byte, and a token yields at most two events (an implicit null key or
  // value next to it): 4 per byte, plus the documents, leaves a margin.
  {
    std::istringstream in(text);
    YAML::Parser parser(in);
    EventBudget budget(4 * static_cast<int64_t>(text.size()) + 64);
    while (parser.HandleNextDocument(budget)) {
    }
  }
  return YAML::LoadAll(text);
}

YAML::Node LoadYaml(const std::string& text) {
  std::vector<YAML::Node> docs = LoadAllYaml(text);
  return docs.empty() ? YAML::Node() : docs.front();
}

}  // namespace fusionrl
