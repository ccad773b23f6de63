// An op of the target run with the session's key off, in C++.
//
// Some ops of the target reach the key with inner calls a backend makes itself: a CPU kernel that
// is torch's composite one (``convolution`` calls its implementations, ``sort`` calls
// ``sort.stable``), or one whose CPU kernel calls ops outside the target through the dispatcher
// (``sum.dim_IntList`` calls ``fill_``; session_key.NATIVE_KERNEL_CALLS). Those inner calls are
// the backend's business, so the op runs with the key off, as under the Python mode. The Python
// kernel doing it (session_key._as_backend_kernel) cost a trip into Python per call: a bert
// training step makes some thirty of them (sum, mean, layer norm's backward), 15 us each.
// This kernel calls the op again from the top with the key excluded, as that Python kernel
// does (autograd is already off below its own kernel), so both run the same kernels.
#include "registry.h"

#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <string>

namespace pf_native {

namespace {

class WithKeyOff final : public c10::OperatorKernel {
 public:
  WithKeyOff(c10::DispatchKey key, std::shared_ptr<std::atomic<int64_t>> served)
      : key_(key), served_(std::move(served)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    {
      c10::impl::ExcludeDispatchKeyGuard off(key_);
      op.callBoxed(stack);
    }
    served_->fetch_add(1, std::memory_order_relaxed);
  }

 private:
  c10::DispatchKey key_;
  std::shared_ptr<std::atomic<int64_t>> served_;
};

}  // namespace

int64_t register_with_key_off(const std::string& op_name, const std::string& op_overload,
                              const std::string& key_name) {
  const auto key = c10::parseDispatchKey(key_name);
  auto served = std::make_shared<std::atomic<int64_t>>(0);
  return add_registration(op_name, op_overload, key,
                          torch::CppFunction::makeFromBoxedFunctor(std::make_unique<WithKeyOff>(key, served)),
                          served);
}

}  // namespace pf_native
