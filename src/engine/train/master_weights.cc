#include "engine/train/master_weights.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <string>
#include <utility>

namespace fusionrl {
namespace {

std::string MasterKey(size_t i) { return "master_weight/" + std::to_string(i); }

bool IsMaster(const at::Tensor& stepped, const at::Tensor& param) {
  return !stepped.is_same(param);
}

}  // namespace

MasterWeightAdamW::MasterWeightAdamW(std::vector<at::Tensor> params,
                                     const AdamWSettings& s)
    : params_(std::move(params)) {
  at::NoGradGuard no_grad;
  stepped_.reserve(params_.size());
  for (const at::Tensor& p : params_) {
    if (p.scalar_type() == at::kFloat) {
      stepped_.push_back(p);
    } else {
      stepped_.push_back(p.detach().to(at::kFloat).clone().requires_grad_());
      ++masters_;
    }
  }
  adamw_ = std::make_unique<torch::optim::AdamW>(
      stepped_, torch::optim::AdamWOptions(s.lr)
                    .betas(std::make_tuple(s.beta1, s.beta2))
                    .eps(s.eps)
                    .weight_decay(s.weight_decay));
}

MasterWeightAdamW::~MasterWeightAdamW() = default;

void MasterWeightAdamW::ZeroGrad() {
  // The parameters' gradients only: a master's is overwritten by
  // GradientsToMasters() before anything reads it.
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void MasterWeightAdamW::MastersFromParameters() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& m = stepped_[i];
    const at::Tensor& p = params_[i];
    if (!IsMaster(m, p)) continue;
    if (!at::equal(m.to(p.device(), p.scalar_type()), p)) {
      m.copy_(p);
    }
  }
}

void MasterWeightAdamW::GradientsToMasters() {
  if (!has_masters()) return;
  MastersFromParameters();
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& m = stepped_[i];
    const at::Tensor& p = params_[i];
    if (!IsMaster(m, p)) continue;
    if (!p.grad().defined()) {
      m.mutable_grad() = at::Tensor();
      continue;
    }
    const at::Tensor g = p.grad().to(m.device(), at::kFloat);
    if (m.grad().defined()) {
      m.mutable_grad().copy_(g);
    } else {
      m.mutable_grad() = g.clone();
    }
  }
}

void MasterWeightAdamW::SetLearningRate(double lr) {
  for (auto& group : adamw_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

void MasterWeightAdamW::Step() {
  adamw_->step();
  if (!has_masters()) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (IsMaster(stepped_[i], params_[i])) params_[i].copy_(stepped_[i]);
  }
}

void MasterWeightAdamW::Save(torch::serialize::OutputArchive& archive) const {
  adamw_->save(archive);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (IsMaster(stepped_[i], params_[i])) {
      archive.write(MasterKey(i), stepped_[i].detach());
    }
  }
}

void MasterWeightAdamW::Load(torch::serialize::InputArchive& archive) {
  adamw_->load(archive);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& m = stepped_[i];
    if (!IsMaster(m, params_[i])) continue;
    at::Tensor saved;
    if (archive.try_read(MasterKey(i), saved)) {
      TORCH_CHECK(saved.sizes() == m.sizes(), MasterKey(i), " has shape ",
                  saved.sizes(), ", the parameter ", m.sizes());
      m.copy_(saved);
    } else {
      m.copy_(params_[i]);
    }
  }
}

void MasterWeightAdamW::MoveMastersTo(c10::Device device) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& m = stepped_[i];
    if (IsMaster(m, params_[i]) && m.device() != device) {
      // set_data keeps the tensor AdamW's parameter group holds.
      m.set_data(m.to(device));
    }
  }
}

int64_t MasterWeightAdamW::MasterBytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (IsMaster(stepped_[i], params_[i])) {
      bytes += stepped_[i].numel() * 4;
    }
  }
  return bytes;
}

}  // namespace fusionrl
