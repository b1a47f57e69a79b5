// The trainer's optimizer state as a torch archive (the AdamW moments, the
// float32 masters and the optimizer step count): files for checkpoints,
// bytes for in-memory snapshots.
#include <torch/serialize.h>

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/train/master_weights.h"
#include "engine/train/trainer.h"

namespace fusionrl {

absl::Status Trainer::SaveOptimizer(const std::string& path) const {
  try {
    torch::serialize::OutputArchive archive;
    master_weights().Save(archive);
    archive.write("optimizer_steps", at::tensor(optimizer_steps_));
    archive.save_to(path);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot write optimizer state to '",
                                            path,
                                            "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status Trainer::LoadOptimizer(const std::string& path) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    master_weights().Load(archive);
    at::Tensor steps;
    archive.read("optimizer_steps", steps);
    optimizer_steps_ = steps.item<int64_t>();
  } catch (const c10::Error& e) {
    return absl::DataLossError(
        absl::StrCat("cannot read optimizer state from '", path,
                     "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Trainer::OptimizerState() const {
  try {
    torch::serialize::OutputArchive archive;
    master_weights().Save(archive);
    archive.write("optimizer_steps", at::tensor(optimizer_steps_));
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot snapshot optimizer: ",
                                            e.what_without_backtrace()));
  }
}

absl::Status Trainer::RestoreOptimizerState(const std::string& bytes) {
  try {
    torch::serialize::InputArchive archive;
    std::istringstream in(bytes);
    archive.load_from(in);
    master_weights().Load(archive);
    at::Tensor steps;
    archive.read("optimizer_steps", steps);
    optimizer_steps_ = steps.item<int64_t>();
  } catch (const c10::Error& e) {
    return absl::DataLossError(
        absl::StrCat("cannot restore optimizer: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace fusionrl
