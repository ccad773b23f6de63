// The backend's own CPU kernels for the target's mask ops (mask_kernels.cpp), for the graph replay.
#pragma once

#include "registry.h"

#include <ATen/core/operator_name.h>
#include <ATen/core/stack.h>

namespace pf_native {

enum class MaskKernel : uint8_t {
  kNone,
  kWhere,
  kEq, kNe, kLt, kLe, kGt, kGe,  // two tensors
  kEqNumber, kNeNumber, kLtNumber, kLeNumber, kGtNumber, kGeNumber,  // a tensor and a number
};

// The kernel of ours for the op ``name``, or kNone.
MaskKernel mask_kernel_for(const c10::OperatorName& name);

// Runs ``kernel`` on ``call`` (the op's arguments) and leaves its result there, where the call
// fits it (see mask_kernels.cpp); false, ``call`` untouched, where torch's kernel must run it.
bool run_mask_kernel(MaskKernel kernel, torch::jit::Stack& call);

// The calls ``run_mask_kernel`` served since the last ask, and zero again (for the tests).
int64_t take_mask_kernel_calls();

// Off: every call is torch's kernel's (for measuring what the loops save, and the tests).
void set_mask_kernels_enabled(bool on);

}  // namespace pf_native
