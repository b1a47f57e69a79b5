// The pieces of the config schema shared by its reader, validator and
// emitter: error formatting, exact doubles, and the enum spellings of
// fusionrl/config.h.
#include "core/config_schema.h"

#include <charconv>
#include <cstddef>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fusionrl {

namespace {

// One enumerator and its YAML spelling.
template <class E>
struct Spelling {
  E value;
  const char* name;
};

// The enumerator spelled `name` in `table`; the error lists the spellings in
// table order.
template <class E, size_t N>
absl::StatusOr<E> ParseName(absl::string_view name,
                            const Spelling<E> (&table)[N]) {
  for (const Spelling<E>& s : table) {
    if (name == s.name) return s.value;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "must be one of ",
      absl::StrJoin(
          table, ", ",
          [](std::string* out, const Spelling<E>& s) { out->append(s.name); }),
      "; got '", name, "'"));
}

template <class E, size_t N>
const char* NameOf(E value, const Spelling<E> (&table)[N]) {
  for (const Spelling<E>& s : table) {
    if (s.value == value) return s.name;
  }
  return "?";
}

constexpr Spelling<AdvEstimator> kAdvEstimators[] = {
    {AdvEstimator::kGrpo, "grpo"},
    {AdvEstimator::kRloo, "rloo"},
    {AdvEstimator::kReinforcePp, "reinforce_pp"}};
constexpr Spelling<LossAggMode> kLossAggModes[] = {
    {LossAggMode::kTokenMean, "token-mean"},
    {LossAggMode::kSeqMeanTokenMean, "seq-mean-token-mean"},
    {LossAggMode::kSeqMeanTokenSum, "seq-mean-token-sum"},
    {LossAggMode::kSeqMeanTokenSumNorm, "seq-mean-token-sum-norm"}};
constexpr Spelling<KlEstimator> kKlEstimators[] = {{KlEstimator::kK1, "k1"},
                                                   {KlEstimator::kK2, "k2"},
                                                   {KlEstimator::kK3, "k3"}};
constexpr Spelling<KlMode> kKlModes[] = {{KlMode::kLoss, "loss"},
                                         {KlMode::kReward, "reward"}};
constexpr Spelling<BehaviourWeightLevel> kBehaviourWeightLevels[] = {
    {BehaviourWeightLevel::kToken, "token"},
    {BehaviourWeightLevel::kSequence, "sequence"}};
constexpr Spelling<BehaviourWeightMode> kBehaviourWeightModes[] = {
    {BehaviourWeightMode::kTruncate, "truncate"},
    {BehaviourWeightMode::kMask, "mask"}};
constexpr Spelling<OverlongMode> kOverlongModes[] = {
    {OverlongMode::kKeep, "keep"},
    {OverlongMode::kMask, "mask"},
    {OverlongMode::kPenalize, "penalize"}};
constexpr Spelling<RolloutCorrection> kRolloutCorrections[] = {
    {RolloutCorrection::kNone, "none"},
    {RolloutCorrection::kTis, "tis"},
    {RolloutCorrection::kMis, "mis"}};
constexpr Spelling<PlacementMode> kPlacementModes[] = {
    {PlacementMode::kColocatedSync, "colocated-sync"},
    {PlacementMode::kDisaggregated, "disaggregated"},
    {PlacementMode::kFused, "fused"}};
constexpr Spelling<AttentionKernel> kAttentionKernels[] = {
    {AttentionKernel::kFused, "fused"},
    {AttentionKernel::kComposite, "composite"}};
constexpr Spelling<DecodeMode> kDecodeModes[] = {
    {DecodeMode::kFused, "fused"},
    {DecodeMode::kComposite, "composite"},
    {DecodeMode::kStatic, "static"}};
constexpr Spelling<DataPlane> kDataPlanes[] = {
    {DataPlane::kController, "controller"}, {DataPlane::kC10d, "c10d"}};
constexpr Spelling<OffloadPolicy> kOffloadPolicies[] = {
    {OffloadPolicy::kNever, "never"}, {OffloadPolicy::kAuto, "auto"}};
constexpr Spelling<MoeGates> kMoeGates[] = {
    {MoeGates::kAuto, "auto"},
    {MoeGates::kRenormalised, "renormalised"},
    {MoeGates::kProbabilities, "probabilities"}};
constexpr Spelling<FusedTurns> kFusedTurns[] = {
    {FusedTurns::kAuto, "auto"},
    {FusedTurns::kConcurrent, "concurrent"},
    {FusedTurns::kInterleaved, "interleaved"},
    {FusedTurns::kProbe, "probe"}};
constexpr Spelling<ExpertSampling> kExpertSampling[] = {
    {ExpertSampling::kGathered, "gathered"}, {ExpertSampling::kShard, "shard"}};
constexpr Spelling<OverStalePolicy> kOverStalePolicies[] = {
    {OverStalePolicy::kRegenerate, "regenerate"},
    {OverStalePolicy::kDrop, "drop"}};
constexpr Spelling<RolloutVersion> kRolloutVersions[] = {
    {RolloutVersion::kLagged, "lagged"},
    {RolloutVersion::kNewest, "newest"},
    {RolloutVersion::kJustInTime, "jit"}};
constexpr Spelling<ActivationPolicy> kActivationPolicies[] = {
    {ActivationPolicy::kKeep, "keep"},
    {ActivationPolicy::kRecompute, "recompute"},
    {ActivationPolicy::kSwap, "swap"},
    {ActivationPolicy::kAuto, "auto"}};
// kDefault is spelled "" and parsed before the table (an error lists the
// actions, then says what empty means).
constexpr Spelling<SubBlockActivation> kSubBlockActions[] = {
    {SubBlockActivation::kKeep, "keep"},
    {SubBlockActivation::kRecompute, "recompute"},
    {SubBlockActivation::kSwap, "swap"}};

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseLoraTargets(
    absl::string_view targets) {
  std::vector<bool> on(std::size(kLoraTargetNames), false);
  bool any = false;
  for (absl::string_view raw : absl::StrSplit(targets, ',')) {
    const absl::string_view name = absl::StripAsciiWhitespace(raw);
    if (name.empty()) continue;
    any = true;
    if (name == "all-linear") {
      on.assign(on.size(), true);
      continue;
    }
    size_t i = 0;
    while (i < on.size() && name != kLoraTargetNames[i]) ++i;
    if (i == on.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown projection '", name, "' (known: ",
                       absl::StrJoin(kLoraTargetNames, ", "), ", all-linear)"));
    }
    on[i] = true;
  }
  if (!any) {
    return absl::InvalidArgumentError(
        "names no projection (e.g. q_proj,v_proj or all-linear)");
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < on.size(); ++i) {
    if (on[i]) out.emplace_back(kLoraTargetNames[i]);
  }
  return out;
}

absl::StatusOr<ActivationPolicy> ParseActivationPolicy(absl::string_view name) {
  return ParseName<ActivationPolicy>(name, kActivationPolicies);
}
const char* ActivationPolicyName(ActivationPolicy policy) {
  return NameOf(policy, kActivationPolicies);
}

absl::StatusOr<SubBlockActivation> ParseSubBlockActivation(
    absl::string_view name) {
  if (name.empty()) return SubBlockActivation::kDefault;
  absl::StatusOr<SubBlockActivation> action =
      ParseName<SubBlockActivation>(name, kSubBlockActions);
  if (!action.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be keep, recompute or swap (empty: the policy's "
                     "action); got '",
                     name, "'"));
  }
  return action;
}
const char* SubBlockActivationName(SubBlockActivation setting) {
  if (setting == SubBlockActivation::kDefault) return "";
  return NameOf(setting, kSubBlockActions);
}

absl::StatusOr<AdvEstimator> ParseAdvEstimator(absl::string_view name) {
  return ParseName<AdvEstimator>(name, kAdvEstimators);
}
const char* AdvEstimatorName(AdvEstimator estimator) {
  return NameOf(estimator, kAdvEstimators);
}

absl::StatusOr<LossAggMode> ParseLossAggMode(absl::string_view name) {
  return ParseName<LossAggMode>(name, kLossAggModes);
}
const char* LossAggModeName(LossAggMode mode) {
  return NameOf(mode, kLossAggModes);
}

absl::StatusOr<KlEstimator> ParseKlEstimator(absl::string_view name) {
  return ParseName<KlEstimator>(name, kKlEstimators);
}
const char* KlEstimatorName(KlEstimator estimator) {
  return NameOf(estimator, kKlEstimators);
}

absl::StatusOr<KlMode> ParseKlMode(absl::string_view name) {
  return ParseName<KlMode>(name, kKlModes);
}
const char* KlModeName(KlMode mode) { return NameOf(mode, kKlModes); }

absl::StatusOr<BehaviourWeightLevel> ParseBehaviourWeightLevel(
    absl::string_view name) {
  return ParseName<BehaviourWeightLevel>(name, kBehaviourWeightLevels);
}
const char* BehaviourWeightLevelName(BehaviourWeightLevel level) {
  return NameOf(level, kBehaviourWeightLevels);
}

absl::StatusOr<OverlongMode> ParseOverlongMode(absl::string_view name) {
  return ParseName<OverlongMode>(name, kOverlongModes);
}
const char* OverlongModeName(OverlongMode mode) {
  return NameOf(mode, kOverlongModes);
}

absl::StatusOr<RolloutCorrection> ParseRolloutCorrection(
    absl::string_view name) {
  return ParseName<RolloutCorrection>(name, kRolloutCorrections);
}
const char* RolloutCorrectionName(RolloutCorrection correction) {
  return NameOf(correction, kRolloutCorrections);
}

absl::StatusOr<BehaviourWeightMode> ParseBehaviourWeightMode(
    absl::string_view name) {
  return ParseName<BehaviourWeightMode>(name, kBehaviourWeightModes);
}
const char* BehaviourWeightModeName(BehaviourWeightMode mode) {
  return NameOf(mode, kBehaviourWeightModes);
}

absl::StatusOr<PlacementMode> ParsePlacementMode(absl::string_view name) {
  return ParseName<PlacementMode>(name, kPlacementModes);
}
const char* PlacementModeName(PlacementMode mode) {
  return NameOf(mode, kPlacementModes);
}

absl::StatusOr<AttentionKernel> ParseAttentionKernel(absl::string_view name) {
  return ParseName<AttentionKernel>(name, kAttentionKernels);
}
const char* AttentionKernelName(AttentionKernel kernel) {
  return NameOf(kernel, kAttentionKernels);
}

absl::StatusOr<DecodeMode> ParseDecodeMode(absl::string_view name) {
  return ParseName<DecodeMode>(name, kDecodeModes);
}
const char* DecodeModeName(DecodeMode mode) {
  return NameOf(mode, kDecodeModes);
}

absl::StatusOr<DataPlane> ParseDataPlane(absl::string_view name) {
  return ParseName<DataPlane>(name, kDataPlanes);
}
const char* DataPlaneName(DataPlane plane) {
  return NameOf(plane, kDataPlanes);
}

absl::StatusOr<OffloadPolicy> ParseOffloadPolicy(absl::string_view name) {
  return ParseName<OffloadPolicy>(name, kOffloadPolicies);
}
const char* OffloadPolicyName(OffloadPolicy policy) {
  return NameOf(policy, kOffloadPolicies);
}

absl::StatusOr<MoeGates> ParseMoeGates(absl::string_view name) {
  return ParseName<MoeGates>(name, kMoeGates);
}
const char* MoeGatesName(MoeGates gates) { return NameOf(gates, kMoeGates); }
bool RouterRenormalises(MoeGates gates, int top_k) {
  switch (gates) {
    case MoeGates::kRenormalised:
      return true;
    case MoeGates::kProbabilities:
      return false;
    case MoeGates::kAuto:
      break;
  }
  return top_k >= 2;
}

absl::StatusOr<FusedTurns> ParseFusedTurns(absl::string_view name) {
  return ParseName<FusedTurns>(name, kFusedTurns);
}
const char* FusedTurnsName(FusedTurns turns) {
  return NameOf(turns, kFusedTurns);
}

absl::StatusOr<ExpertSampling> ParseExpertSampling(absl::string_view name) {
  return ParseName<ExpertSampling>(name, kExpertSampling);
}
const char* ExpertSamplingName(ExpertSampling sampling) {
  return NameOf(sampling, kExpertSampling);
}

absl::StatusOr<OverStalePolicy> ParseOverStalePolicy(absl::string_view name) {
  return ParseName<OverStalePolicy>(name, kOverStalePolicies);
}
const char* OverStalePolicyName(OverStalePolicy policy) {
  return NameOf(policy, kOverStalePolicies);
}

absl::StatusOr<RolloutVersion> ParseRolloutVersion(absl::string_view name) {
  return ParseName<RolloutVersion>(name, kRolloutVersions);
}
const char* RolloutVersionName(RolloutVersion rule) {
  return NameOf(rule, kRolloutVersions);
}

namespace config_internal {

absl::Status FormatError(absl::string_view source, const FieldError& e) {
  std::vector<absl::string_view> parts;
  for (absl::string_view p : {source, absl::string_view(e.path)}) {
    if (!p.empty()) parts.push_back(p);
  }
  parts.push_back(e.reason);
  return absl::Status(e.code, absl::StrJoin(parts, ": "));
}

std::string FormatDouble(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return absl::StrCat(v);
  return std::string(buf, end);
}

}  // namespace config_internal
}  // namespace fusionrl
