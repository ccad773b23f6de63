// In-place and out= ops outside the target, served in C++: the functional twin, then a copy into
// the destination (``self``, or ``out``).
//
// A keyed pf.eager session meets an in-place op outside its target (``add_``: the autograd
// engine's gradient accumulation, the optimizers' updates) hundreds of times a step, and some
// models an out= op as often (mixtral's grouped matmuls write with ``mm.out``). Its Python kernel
// (keyed_kernels._through_twin_in_place, EagerMode._through_twin) costs a trip into Python each
// time; this kernel does the same in C++: where every tensor argument is strided and torch's own
// (and none shares part of the destination's memory, which eager refuses as here), the twin is
// called with the op's own arguments (out= left out; an op of the target with the session's key
// off, any other through the key, whose kernel for it lowers it), and when its result has the
// destination's shape (or the destination is an empty out= tensor, resized by the floor's
// ``resize_`` where the session has it) and casts into its dtype (out=: is of its dtype, as is the governing input:
// eager's checks of another dtype are the Python kernel's), ``copy_`` (the floor's) writes it
// there. Anything else goes to the Python kernel, which decides it (other resizes, refusing a
// lossy cast, sparse arguments). Calls served here are counted, and the session adds the counts
// to its statistics.
#include "registry.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <string>

namespace py = pybind11;

namespace pf_native {

namespace {

// Each tensor of ``value``: itself, or a list's tensors.
template <typename F>
void each_tensor(const c10::IValue& value, F&& f) {
  if (value.isTensor()) {
    f(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector()) f(t);
  }
}

class ThroughTwin final : public c10::OperatorKernel {
 public:
  ThroughTwin(c10::OperatorHandle twin, bool twin_in_target, bool out_variant, bool resizes,
              std::shared_ptr<std::atomic<int64_t>> served, py::object fallback, c10::DispatchKey key)
      : twin_(std::move(twin)), twin_in_target_(twin_in_target), out_variant_(out_variant), resizes_(resizes),
        served_(std::move(served)), fallback_(std::move(fallback)), key_(key) {}


  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
    bool own = true;
    for (auto it = first; it != stack->end(); ++it) {
      each_tensor(*it, [&](const at::Tensor& t) { own = own && torchs_own(t); });
    }
    const c10::IValue& written = out_variant_ ? stack->back() : *first;
    if (!own || !written.isTensor()) {
      return to_python(op, stack);
    }
    at::Tensor destination = written.toTensor();
    // the twin's arguments: the op's (in place: self among them), or all but out=
    auto end = out_variant_ ? stack->end() - 1 : stack->end();
    for (auto it = out_variant_ ? first : first + 1; it != end; ++it) {  // eager's refusal of a partly shared input
      each_tensor(*it, [&](const at::Tensor& t) { at::assert_no_partial_overlap(destination, t); });
    }
    torch::jit::Stack arguments(first, end);  // the stack itself is kept for the Python kernel
    if (twin_in_target_) {
      c10::impl::ExcludeDispatchKeyGuard off(key_);
      twin_.callBoxed(&arguments);
    } else {  // the twin's own kernel on the key lowers it
      twin_.callBoxed(&arguments);
    }
    const c10::IValue& out = arguments.back();
    if (arguments.size() != 1 || !out.isTensor()) {
      return to_python(op, stack);
    }
    const at::Tensor& result = out.toTensor();
    // another size: an empty out= tensor is resized (below); any other resize, or eager's refusal
    // (in place), is Python's
    const bool resize = !result.sizes().equals(destination.sizes());
    if (resize && !(out_variant_ && resizes_ && destination.numel() == 0)) {
      return to_python(op, stack);
    }
    if (out_variant_) {  // only where out= is of the result's and the governing input's dtype:
      // eager's checks of another dtype (a cast it refuses, a reduction computed in out's) are
      // Python's. That input is the first with dimensions, else the first: a 0-dim one ahead of it
      // promotes by its kind only (``10000 ** x`` wraps the number as an int64 tensor), as
      // EagerMode._through_twin's ``_governing_input``.
      const at::Tensor* input = nullptr;
      for (auto it = first; it != end; ++it) {
        if (!it->isTensor()) continue;
        const at::Tensor& t = it->toTensor();
        if (input == nullptr || (input->dim() == 0 && t.dim() > 0)) input = &t;
        if (t.dim() > 0) break;
      }
      if (result.scalar_type() != destination.scalar_type() ||
          (input != nullptr && input->scalar_type() != destination.scalar_type())) {
        return to_python(op, stack);
      }
    } else if (result.scalar_type() != destination.scalar_type() &&
               !c10::canCast(result.scalar_type(), destination.scalar_type())) {
      return to_python(op, stack);
    }
    {
      c10::impl::ExcludeDispatchKeyGuard off(key_);
      if (resize) {  // the floor's resize_, as the Python kernel resizes an out= tensor
        destination.resize_(result.sizes());
      }
      at::_ops::copy_::call(destination, result, false);
    }
    torch::jit::drop(*stack, n);
    stack->emplace_back(destination);
    served_->fetch_add(1, std::memory_order_relaxed);
  }

 private:
  void to_python(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    py::gil_scoped_acquire gil;
    // the arguments as torch hands them to a Python kernel (a dtype as torch.dtype, not its number)
    auto [args, kwargs] = python_arguments(op.schema(), *stack);
    py::object result = fallback_(*args, **kwargs);
    torch::jit::drop(*stack, n);
    push_python_result(op.schema(), *stack, result);
  }

  c10::OperatorHandle twin_;
  bool twin_in_target_;
  bool out_variant_;
  bool resizes_;  // ``resize_`` is the target's or the floor's (else the Python kernel lowers it, or refuses)
  std::shared_ptr<std::atomic<int64_t>> served_;
  PythonCallable fallback_;
  c10::DispatchKey key_;
};

}  // namespace

// Registers the kernel for ``op`` on dispatch key ``key``; returns its index (for ``take_served``).
int64_t register_through_twin(const std::string& op_name, const std::string& op_overload,
                              const std::string& twin_name, const std::string& twin_overload,
                              bool twin_in_target, bool out_variant, bool resizes, const std::string& key_name,
                              py::object fallback) {
  const auto key = c10::parseDispatchKey(key_name);
  auto twin = operator_named(twin_name, twin_overload);
  auto served = std::make_shared<std::atomic<int64_t>>(0);
  return add_registration(op_name, op_overload, key,
                          torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ThroughTwin>(
                              twin, twin_in_target, out_variant, resizes, served, std::move(fallback), key)),
                          served);
}

}  // namespace pf_native
