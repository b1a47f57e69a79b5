#include "core/mode_spec.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fusionrl {
namespace {

// kBench's suffixes, "+turns:T", "+partial:N", "+version:V", "+shared:M":
// strips them from the end of `text`, last first, into `m`; a spec without
// one gets that knob's default (no rollout_version: the config's).
absl::Status ParseSuffixes(const std::string& full, std::string& text,
                           ModeSpec& m) {
  int partial_tokens = 0, shared_steps = 1;
  FusedTurns turns = FusedTurns::kAuto;
  for (const std::string suffix :
       {"+shared", "+version", "+partial", "+turns"}) {
    const size_t at = text.find(suffix);
    if (at == std::string::npos) continue;
    std::string value = text.substr(at + suffix.size());
    text = text.substr(0, at);
    const bool partial = suffix == "+partial";
    const bool version = suffix == "+version";
    const bool shared = suffix == "+shared";
    bool ok = value.size() >= 2 && value[0] == ':';
    if (ok && shared) {
      ok =
          absl::SimpleAtoi(value.substr(1), &shared_steps) && shared_steps >= 1;
    } else if (ok && version) {
      absl::StatusOr<RolloutVersion> v = ParseRolloutVersion(value.substr(1));
      ok = v.ok();
      if (ok) m.rollout_version = *v;
    } else if (ok && partial) {
      ok = absl::SimpleAtoi(value.substr(1), &partial_tokens) &&
           partial_tokens >= 1;
    } else if (ok) {
      absl::StatusOr<FusedTurns> t = ParseFusedTurns(value.substr(1));
      ok = t.ok();
      if (ok) turns = *t;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--modes: '", full, "': expected <mode>",
          shared    ? "+shared:M, M >= 1 (stalesync.steps_per_version)"
          : version ? "+version:V, V one of lagged, newest, jit "
                      "(stalesync.rollout_version)"
          : partial ? "+partial:N, N >= 1 (stalesync.partial_rollout_tokens)"
                    : "+turns:T, T one of auto, concurrent, interleaved, "
                      "probe (placement.fused_turns)",
          "; suffixes come in the order +turns, +partial, +version, "
          "+shared"));
    }
  }
  m.fused_turns = turns;
  m.partial_rollout_tokens = partial_tokens;
  m.steps_per_version = shared_steps;
  return absl::OkStatus();
}

bool InLagRange(int v) { return v >= 0 && v <= 1024; }

// kBench's "<prefix>[:s]" after the prefix: `rest` is "" or ":s".
absl::Status ParseBenchLag(const std::string& text, const std::string& prefix,
                           const std::string& rest, ModeSpec& m) {
  if (!rest.empty() &&
      (rest[0] != ':' || !absl::SimpleAtoi(rest.substr(1), &m.policy_lag) ||
       !InLagRange(m.policy_lag))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--modes: '", text, "': expected ", prefix, "[:s], s in 0..1024"));
  }
  return absl::OkStatus();
}

// kSimulate's "fused+stalesync[:s[:k]]" after the prefix: `rest` is "",
// ":s" or ":s:k".
absl::Status ParseSimulateLagAndSkew(const std::string& text,
                                     const std::string& rest, ModeSpec& m) {
  int skew = m.policy_lag;
  if (!rest.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(rest.substr(1), ':');
    bool ok = rest[0] == ':' && parts.size() <= 2 &&
              absl::SimpleAtoi(parts[0], &m.policy_lag);
    skew = m.policy_lag;
    if (ok && parts.size() == 2) ok = absl::SimpleAtoi(parts[1], &skew);
    if (!ok || !InLagRange(m.policy_lag) || !InLagRange(skew)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--modes: '", text,
          "': expected fused+stalesync[:s[:k]] (policy lag s, clock skew k, "
          "each in 0..1024; k = s when omitted)"));
    }
  }
  m.clock_skew = skew;
  return absl::OkStatus();
}

// The mode without suffixes: the placement, then the lag (and, kSimulate,
// the clock skew) its prefix takes.
absl::Status ParseBase(const std::string& text, ModeGrammar grammar,
                       ModeSpec& m) {
  const bool bench = grammar == ModeGrammar::kBench;
  if (text == "colocated-sync" || text == "fused") {
    m.placement =
        text == "fused" ? PlacementMode::kFused : PlacementMode::kColocatedSync;
    if (!bench) m.clock_skew = 0;
    return absl::OkStatus();
  }
  // fused+stalesync (s = 2 by default); bench only: disaggregated (s = 0:
  // OpenRLHF-style synchronous; s > 0: AReaL-style asynchronous).
  struct Prefix {
    const char* name;
    PlacementMode placement;
    int lag;
  };
  for (const Prefix& p :
       {Prefix{"fused+stalesync", PlacementMode::kFused, 2},
        Prefix{"disaggregated", PlacementMode::kDisaggregated, 0}}) {
    const std::string prefix = p.name;
    if (!bench && p.placement == PlacementMode::kDisaggregated) continue;
    if (text.rfind(prefix, 0) != 0) continue;
    m.placement = p.placement;
    m.policy_lag = p.lag;
    const std::string rest = text.substr(prefix.size());
    return bench ? ParseBenchLag(text, prefix, rest, m)
                 : ParseSimulateLagAndSkew(text, rest, m);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--modes: unknown mode '", text, "' (",
      bench ? "colocated-sync, fused, fused+stalesync[:s], disaggregated[:s], "
              "each optionally +turns:T, +partial:N, +version:V and +shared:M"
            : "colocated-sync, fused, fused+stalesync[:s[:k]]",
      ")"));
}

}  // namespace

absl::StatusOr<ModeSpec> ParseModeSpec(const std::string& text,
                                       ModeGrammar grammar) {
  ModeSpec m;
  m.name = text;
  std::string base = text;
  if (grammar == ModeGrammar::kBench) {
    if (absl::Status s = ParseSuffixes(text, base, m); !s.ok()) return s;
  }
  if (absl::Status s = ParseBase(base, grammar, m); !s.ok()) return s;
  return m;
}

void ApplyModeSpec(const ModeSpec& mode, JobConfig& config) {
  config.placement.mode = mode.placement;
  if (mode.placement == PlacementMode::kDisaggregated) {
    // One rollout card next to each training card, sharing the same
    // threads: the same compute, split by role instead of fused.
    config.placement.rollout_cards_per_super_node =
        config.placement.cards_per_super_node;
    config.placement.cards_per_super_node *= 2;
  }
  config.stalesync.max_policy_lag = mode.policy_lag;
  if (mode.policy_lag > 0) config.algorithm.decoupled_loss = true;
  if (mode.clock_skew) config.stalesync.max_clock_skew = *mode.clock_skew;
  if (mode.fused_turns) config.placement.fused_turns = *mode.fused_turns;
  if (mode.partial_rollout_tokens) {
    config.stalesync.partial_rollout_tokens = *mode.partial_rollout_tokens;
  }
  if (mode.rollout_version) {
    config.stalesync.rollout_version = *mode.rollout_version;
  }
  if (mode.steps_per_version) {
    config.stalesync.steps_per_version = *mode.steps_per_version;
  }
}

}  // namespace fusionrl
