// sdpa on its math path for a session whose target has none of the device's fused kernels, in C++.
//
// eager/attention_path.py explains the choice: sdpa's composite runs with the fused backends
// switched off for the call, as ``sdpa_kernel([SDPBackend.MATH])`` leaves them, so it picks the
// math path a backend without fused attention gets. Its Python kernel (on the device's Autograd
// key) cost 60-150 us a call: a dozen getters and setters of the switches and the composite called
// through ``OpOverload.decompose``. This kernel makes the same checks (the query on one of the
// devices, strided, not nested, the user's math backend on), switches the same backends off,
// calls the same CompositeImplicitAutograd kernel, and restores each switch as it was.
#include "registry.h"

#include <ATen/Context.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pf_native {

namespace {

// FlashAttention 3 and 4 have switches only on some releases (4 from torch 2.15): each is saved
// and switched off where this torch's Context has it.
template <typename C, typename = void>
struct HasFA3 : std::false_type {};
template <typename C>
struct HasFA3<C, std::void_t<decltype(std::declval<C&>().setSDPUseFA3(false))>> : std::true_type {};
template <typename C, typename = void>
struct HasFA4 : std::false_type {};
template <typename C>
struct HasFA4<C, std::void_t<decltype(std::declval<C&>().setSDPUseFA4(false))>> : std::true_type {};

// The fused backends off for this object's life, each restored as it was (the switches are
// process-wide, as the Python kernel's context manager sets them).
class FusedOff {
 public:
  FusedOff() : context_(at::globalContext()) {
    flash_ = context_.userEnabledFlashSDP();
    efficient_ = context_.userEnabledMemEfficientSDP();
    cudnn_ = context_.userEnabledCuDNNSDP();
    overrideable_ = context_.userEnabledOverrideableSDP();
    fa3_ = get_fa3(context_);
    fa4_ = get_fa4(context_);
    set_all(false, false, false, false, false, false);
  }
  ~FusedOff() { set_all(flash_, efficient_, cudnn_, overrideable_, fa3_, fa4_); }
  FusedOff(const FusedOff&) = delete;
  FusedOff& operator=(const FusedOff&) = delete;

 private:
  template <typename C>
  static bool get_fa3(C& c) {
    if constexpr (HasFA3<C>::value) return c.userEnabledFA3SDP(); else return false;
  }
  template <typename C>
  static bool get_fa4(C& c) {
    if constexpr (HasFA4<C>::value) return c.userEnabledFA4SDP(); else return false;
  }
  void set_all(bool flash, bool efficient, bool cudnn, bool overrideable, bool fa3, bool fa4) {
    context_.setSDPUseFlash(flash);
    context_.setSDPUseMemEfficient(efficient);
    context_.setSDPUseCuDNN(cudnn);
    context_.setSDPUseOverrideable(overrideable);
    set_fa3(context_, fa3);
    set_fa4(context_, fa4);
  }
  template <typename C>
  static void set_fa3(C& c, bool on) {
    if constexpr (HasFA3<C>::value) c.setSDPUseFA3(on);
  }
  template <typename C>
  static void set_fa4(C& c, bool on) {
    if constexpr (HasFA4<C>::value) c.setSDPUseFA4(on);
  }

  at::Context& context_;
  bool flash_, efficient_, cudnn_, overrideable_, fa3_, fa4_;
};

class MathAttention final : public c10::OperatorKernel {
 public:
  MathAttention(std::vector<c10::DeviceType> devices, std::shared_ptr<std::atomic<int64_t>> served)
      : devices_(std::move(devices)), served_(std::move(served)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    const c10::IValue& first = (*stack)[stack->size() - n];
    bool math = false;
    if (first.isTensor()) {
      const at::Tensor& query = first.toTensor();
      math = std::find(devices_.begin(), devices_.end(), query.device().type()) != devices_.end() &&
             query.layout() == c10::kStrided && !query.is_nested() && at::globalContext().userEnabledMathSDP();
    }
    if (!math) {
      return op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
    }
    served_->fetch_add(1, std::memory_order_relaxed);
    FusedOff off;
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
  }

 private:
  std::vector<c10::DeviceType> devices_;
  std::shared_ptr<std::atomic<int64_t>> served_;
};

}  // namespace

int64_t register_math_attention(const std::string& key_name, const std::vector<std::string>& devices) {
  std::vector<c10::DeviceType> types;
  for (const auto& device : devices) types.push_back(c10::Device(device).type());
  auto served = std::make_shared<std::atomic<int64_t>>(0);
  return add_registration("aten::scaled_dot_product_attention", "", c10::parseDispatchKey(key_name),
                          torch::CppFunction::makeFromBoxedFunctor(std::make_unique<MathAttention>(types, served)),
                          served);
}

}  // namespace pf_native
