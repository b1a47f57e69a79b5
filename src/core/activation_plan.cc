// ResolveActivationPlan: model.activations (a policy, per-sub-block actions
// and per-layer overrides) -> the action of every sub-block of every layer.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fusionrl/config.h"

namespace fusionrl {
namespace {

std::optional<ActivationAction> ParseAction(absl::string_view s) {
  if (s == "keep") return ActivationAction::kKeep;
  if (s == "recompute") return ActivationAction::kRecompute;
  if (s == "swap") return ActivationAction::kSwap;
  return std::nullopt;
}

}  // namespace

const char* ActivationActionName(ActivationAction action) {
  switch (action) {
    case ActivationAction::kKeep:
      return "keep";
    case ActivationAction::kRecompute:
      return "recompute";
    case ActivationAction::kSwap:
      return "swap";
  }
  return "?";
}

absl::StatusOr<std::vector<LayerActivationPlan>> ResolveActivationPlan(
    const ActivationConfig& config, int n_layers) {
  if (config.policy == ActivationPolicy::kAuto) {
    // The planner (engine/train/activation_planner.h) replaces it by
    // measurement.
    return std::vector<LayerActivationPlan>(std::max(n_layers, 0));
  }
  const ActivationAction policy = config.policy == ActivationPolicy::kRecompute
                                      ? ActivationAction::kRecompute
                                  : config.policy == ActivationPolicy::kSwap
                                      ? ActivationAction::kSwap
                                      : ActivationAction::kKeep;
  LayerActivationPlan base{policy, policy, policy, ActivationAction::kKeep,
                           ActivationAction::kKeep};
  struct Field {
    const char* name;
    SubBlockActivation setting;
    ActivationAction LayerActivationPlan::*member;
  };
  const Field fields[] = {
      {"attention", config.attention, &LayerActivationPlan::attention},
      {"mlp", config.mlp, &LayerActivationPlan::mlp},
      {"norm", config.norm, &LayerActivationPlan::norm},
      {"attention_core", config.attention_core,
       &LayerActivationPlan::attention_core},
      {"mlp_act", config.mlp_act, &LayerActivationPlan::mlp_act}};
  // attention_core and mlp_act are keep or recompute, and not set by the
  // policy (a recomputed sub-block already recomputes its inside).
  auto parse = [](const Field& f,
                  absl::string_view value) -> absl::StatusOr<ActivationAction> {
    const auto action = ParseAction(value);
    const bool core = f.member == &LayerActivationPlan::attention_core ||
                      f.member == &LayerActivationPlan::mlp_act;
    if (!action || (core && *action == ActivationAction::kSwap)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown action '", value, "' for ", f.name,
          core ? " (keep or recompute)" : " (keep, recompute or swap)"));
    }
    return *action;
  };
  for (const Field& f : fields) {
    if (f.setting == SubBlockActivation::kDefault) continue;
    absl::StatusOr<ActivationAction> action =
        parse(f, SubBlockActivationName(f.setting));
    if (!action.ok()) return action.status();
    base.*f.member = *action;
  }
  std::vector<LayerActivationPlan> plan(std::max(n_layers, 0), base);
  std::vector<bool> seen(plan.size(), false);
  for (absl::string_view entry :
       absl::StrSplit(config.layers, ';', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> parts =
        absl::StrSplit(entry, absl::MaxSplits(':', 1));
    int layer = -1;
    if (parts.size() != 2 ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &layer)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad entry '", absl::StripAsciiWhitespace(entry),
                       "': expected '<layer>: <sub-block>=<action>, ...'"));
    }
    if (layer < 0 || layer >= n_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", layer, " out of range: model.n_layers is ", n_layers));
    }
    if (seen[layer]) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " listed twice"));
    }
    seen[layer] = true;
    for (absl::string_view item :
         absl::StrSplit(parts[1], ',', absl::SkipWhitespace())) {
      const std::vector<absl::string_view> kv =
          absl::StrSplit(item, absl::MaxSplits('=', 1));
      const absl::string_view key =
          absl::StripAsciiWhitespace(kv.empty() ? "" : kv[0]);
      const Field* field = nullptr;
      for (const Field& f : fields) {
        if (key == f.name) field = &f;
      }
      if (kv.size() != 2 || field == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", layer, ": bad item '", absl::StripAsciiWhitespace(item),
            "': expected attention|mlp|norm|attention_core|mlp_act=<action>"));
      }
      const absl::string_view value = absl::StripAsciiWhitespace(kv[1]);
      absl::StatusOr<ActivationAction> action = parse(*field, value);
      if (!action.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", layer, ": ", action.status().message()));
      }
      plan[layer].*field->member = *action;
    }
  }
  return plan;
}

}  // namespace fusionrl
