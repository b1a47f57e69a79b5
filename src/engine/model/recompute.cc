#include "engine/model/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace fusionrl {
namespace {

using torch::autograd::variable_list;

struct SubBlockHolder : torch::CustomClassHolder {
  RecomputeFn fn;
  std::vector<at::Tensor> params;  // the sub-block's parameters
};

// Forward (grad off, as for every custom Function): runs the sub-block and
// saves only its inputs. Backward: runs it again with grad on, on detached
// copies of the inputs, and differentiates that graph. The parameters are
// inputs of the Function too, so the outer engine gets their gradients as
// this node's outputs and accumulates them into .grad exactly like any other
// use (gradient accumulation over micro-batches works unchanged).
// Arguments: (holder, inputs, params); outputs: the sub-block's outputs.
struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static variable_list forward(torch::autograd::AutogradContext* ctx,
                               const c10::intrusive_ptr<SubBlockHolder>& body,
                               at::TensorList inputs, at::TensorList params) {
    (void)params;  // read by the body through its module
    ctx->set_materialize_grads(false);
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["body"] = c10::IValue::make_capsule(body);
    return body->fn(inputs.vec());
  }

  static variable_list backward(torch::autograd::AutogradContext* ctx,
                                variable_list grad_outputs) {
    auto body = c10::static_intrusive_pointer_cast<SubBlockHolder>(
        ctx->saved_data["body"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    variable_list inputs;
    for (const auto& v : saved) {
      inputs.push_back(v.detach().requires_grad_(v.requires_grad()));
    }
    variable_list outputs;
    {
      at::AutoGradMode grad_on(true);
      outputs = body->fn(inputs);
    }
    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].defined() &&
          outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    // What to differentiate with respect to: the inputs, then the params
    // (the params are the Function's last inputs; this node's edges say
    // which of them need a gradient).
    variable_list wrt;
    std::vector<size_t> slot;  // index in the result of each wrt entry
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        slot.push_back(1 + i);
      }
    }
    const std::vector<at::Tensor>& params = body->params;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].requires_grad()) {
        wrt.push_back(params[i]);
        slot.push_back(1 + inputs.size() + i);
      }
    }
    variable_list result(1 + inputs.size() + params.size());
    if (roots.empty() || wrt.empty()) return result;
    variable_list grads =
        torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) result[slot[i]] = grads[i];
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> RunRecomputed(RecomputeFn fn,
                                      const std::vector<at::Tensor>& inputs,
                                      std::vector<at::Tensor> params) {
  auto holder = c10::make_intrusive<SubBlockHolder>();
  holder->fn = std::move(fn);
  holder->params = std::move(params);
  const std::vector<at::Tensor> param_list = holder->params;
  return RecomputeFunction::apply(holder, at::TensorList(inputs),
                                  at::TensorList(param_list));
}

}  // namespace fusionrl
