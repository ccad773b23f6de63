// The backend's own CPU kernels for the target's mask ops: ``where`` and the comparisons.
//
// A decomposed activation's backward is a comparison and a ``where`` (ReLU's ``threshold_backward``
// is ``where(x <= 0, 0, grad)``; hardtanh's, hardswish's, hardsigmoid's alike). CPU eager's
// kernels for both are not vectorised where an operand or the result is bool: on 75k floats
// ``where`` takes 120-300 us and ``le`` 45 us, a ``mul`` 12 us, so a conv net's step in a session
// paid more for its masks than for its convolutions' backward. A backend has these as plain
// vector loops; these are those loops, taken by the graph replay (graph_replay.cpp) for the
// calls they fit: CPU tensors, contiguous or a single element, one dtype. Both ops compute no
// rounding (a select copies bits; a comparison is exact in the common dtype), so the results are
// torch's bit for bit; every other call goes to torch's kernel as before.
#include "mask_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/stack.h>
#include <c10/util/irange.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>

// Compiled for AVX2 as well where the compiler can pick at load time; at -O3 so the loops vectorise.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PF_VECTOR_LOOP __attribute__((target_clones("avx2", "default"), optimize("O3")))
#elif defined(__x86_64__) && defined(__clang__)
#define PF_VECTOR_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define PF_VECTOR_LOOP
#endif

namespace pf_native {

namespace {

constexpr int64_t kGrain = 32768;  // elements a thread takes at least, as torch's elementwise kernels

std::atomic<int64_t> calls_served{0};
std::atomic<bool> enabled{true};

// out[i] = cond[i] ? a[i] : b[i], each of the three either n values or one (step 0). By bits: a
// select of floating values is a copy of their bits, so one loop per element size serves all. The
// common shapes get a loop each with no index chosen per element: those the compiler vectorises.
template <typename Bits>
PF_VECTOR_LOOP void select_bits(const uint8_t* cond, bool cond_one, const Bits* a, bool a_one, const Bits* b,
                                bool b_one, Bits* out, int64_t begin, int64_t end) {
  if (!cond_one && a_one && !b_one) {  // where(mask, 0, grad): the activations' backward
    const Bits value = a[0];
    for (int64_t i = begin; i < end; ++i) {
      const Bits keep = static_cast<Bits>(0) - static_cast<Bits>(cond[i] != 0);
      out[i] = (value & keep) | (b[i] & ~keep);
    }
  } else if (!cond_one && !a_one && b_one) {
    const Bits value = b[0];
    for (int64_t i = begin; i < end; ++i) {
      const Bits keep = static_cast<Bits>(0) - static_cast<Bits>(cond[i] != 0);
      out[i] = (a[i] & keep) | (value & ~keep);
    }
  } else if (!cond_one && !a_one && !b_one) {
    for (int64_t i = begin; i < end; ++i) {
      const Bits keep = static_cast<Bits>(0) - static_cast<Bits>(cond[i] != 0);
      out[i] = (a[i] & keep) | (b[i] & ~keep);
    }
  } else {  // a single condition, or both values single: rarely met
    for (int64_t i = begin; i < end; ++i) {
      out[i] = cond[cond_one ? 0 : i] != 0 ? a[a_one ? 0 : i] : b[b_one ? 0 : i];
    }
  }
}

enum class Comparison { kEq, kNe, kLt, kLe, kGt, kGe };

template <Comparison kind, typename T>
inline bool compare(T x, T y) {
  if constexpr (kind == Comparison::kEq) return x == y;
  if constexpr (kind == Comparison::kNe) return x != y;
  if constexpr (kind == Comparison::kLt) return x < y;
  if constexpr (kind == Comparison::kLe) return x <= y;
  if constexpr (kind == Comparison::kGt) return x > y;
  return x >= y;
}

// out[i] = x[i] <op> y[i], either side n values or one (a loop each, so each vectorises).
template <Comparison kind, typename T>
PF_VECTOR_LOOP void compare_values(const T* x, bool x_one, const T* y, bool y_one, uint8_t* out, int64_t begin,
                                   int64_t end) {
  if (y_one) {
    const T value = y[0];
    for (int64_t i = begin; i < end; ++i) out[i] = compare<kind>(x[i], value) ? 1 : 0;
  } else if (x_one) {
    const T value = x[0];
    for (int64_t i = begin; i < end; ++i) out[i] = compare<kind>(value, y[i]) ? 1 : 0;
  } else {
    for (int64_t i = begin; i < end; ++i) out[i] = compare<kind>(x[i], y[i]) ? 1 : 0;
  }
}

// A tensor these loops read: on the CPU, dense, its own memory (not a functorch wrapper's, an
// efficient zero tensor's, which has none), no lazy conjugate or negation.
bool plain_cpu(const at::Tensor& t) {
  static const c10::DispatchKeySet wrappers({c10::DispatchKey::FuncTorchBatched,
                                              c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::ZeroTensor});
  return t.defined() && t.device().is_cpu() && torchs_own(t) && t.has_storage() &&
         !t.key_set().has_any(wrappers) && !t.is_conj() && !t.is_neg();
}

// The shape of the call's result where each operand is contiguous with that shape or holds one
// element (a 0-dim tensor, as ``scalar_tensor``'s), and at least one has the shape; else none.
std::optional<c10::IntArrayRef> common_shape(std::initializer_list<const at::Tensor*> operands) {
  std::optional<c10::IntArrayRef> shape;
  for (const at::Tensor* t : operands) {
    if (t->dim() == 0) continue;
    if (!t->is_contiguous()) return std::nullopt;
    if (!shape) {
      shape = t->sizes();
    } else if (*shape != t->sizes()) {
      return std::nullopt;
    }
  }
  return shape;
}

bool select(torch::jit::Stack& call) {
  const at::Tensor& cond = call[0].toTensor();
  const at::Tensor& a = call[1].toTensor();
  const at::Tensor& b = call[2].toTensor();
  if (!plain_cpu(cond) || !plain_cpu(a) || !plain_cpu(b) || cond.scalar_type() != at::kBool ||
      a.scalar_type() != b.scalar_type() || a.is_complex() || a.is_quantized() ||
      a.unsafeGetTensorImpl()->is_wrapped_number() || b.unsafeGetTensorImpl()->is_wrapped_number()) {
    return false;
  }
  const auto shape = common_shape({&cond, &a, &b});
  if (!shape) return false;
  at::Tensor out = at::empty(*shape, b.options());
  const int64_t n = out.numel();
  const bool cond_one = cond.dim() == 0, a_one = a.dim() == 0, b_one = b.dim() == 0;
  const auto* c = static_cast<const uint8_t*>(cond.const_data_ptr());
  auto run = [&](auto bits) {
    using Bits = decltype(bits);
    const auto* x = static_cast<const Bits*>(a.const_data_ptr());
    const auto* y = static_cast<const Bits*>(b.const_data_ptr());
    auto* o = static_cast<Bits*>(out.data_ptr());
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      select_bits<Bits>(c, cond_one, x, a_one, y, b_one, o, begin, end);
    });
  };
  switch (a.element_size()) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    case 8: run(uint64_t{}); break;
    default: return false;
  }
  call.clear();
  call.emplace_back(std::move(out));
  return true;
}

template <Comparison kind>
bool compare_into(const at::Tensor& x, const at::Tensor& y, torch::jit::Stack& call) {
  const auto shape = common_shape({&x, &y});
  if (!shape) return false;
  at::Tensor out = at::empty(*shape, x.options().dtype(at::kBool));
  const int64_t n = out.numel();
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  auto run = [&](auto value) {
    using T = decltype(value);
    const T* p = x.const_data_ptr<T>();
    const T* q = y.const_data_ptr<T>();
    const bool x_one = x.dim() == 0, y_one = y.dim() == 0;
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      compare_values<kind, T>(p, x_one, q, y_one, o, begin, end);
    });
  };
  switch (x.scalar_type()) {
    case at::kFloat: run(float{}); break;
    case at::kDouble: run(double{}); break;
    case at::kLong: run(int64_t{}); break;
    case at::kInt: run(int32_t{}); break;
    default: return false;
  }
  call.clear();
  call.emplace_back(std::move(out));
  return true;
}

bool compare_dtype(at::ScalarType type) {
  return type == at::kFloat || type == at::kDouble || type == at::kLong || type == at::kInt;
}

// ``x <op> y`` of two tensors of one dtype (a 0-dim one broadcast).
template <Comparison kind>
bool compare_tensors(torch::jit::Stack& call) {
  const at::Tensor& x = call[0].toTensor();
  const at::Tensor& y = call[1].toTensor();
  if (!plain_cpu(x) || !plain_cpu(y) || x.scalar_type() != y.scalar_type() || !compare_dtype(x.scalar_type()) ||
      x.unsafeGetTensorImpl()->is_wrapped_number() || y.unsafeGetTensorImpl()->is_wrapped_number()) {
    return false;
  }
  return compare_into<kind>(x, y, call);
}

// ``x <op> number``: torch compares in x's dtype (a number does not promote a tensor of its
// kind), the number converted as a cast converts it (1e40 is a float32 infinity). Only where that
// conversion keeps the kind: a floating tensor with any number, an integral one with an integer
// that fits it.
template <Comparison kind>
bool compare_number(torch::jit::Stack& call) {
  const at::Tensor& x = call[0].toTensor();
  const c10::Scalar number = call[1].toScalar();
  if (!plain_cpu(x) || !compare_dtype(x.scalar_type()) || number.isComplex() || number.isSymbolic()) {
    return false;
  }
  const bool integral = at::isIntegralType(x.scalar_type(), /*includeBool=*/false);
  if (integral && !number.isIntegral(/*includeBool=*/true)) return false;
  if (x.scalar_type() == at::kInt && (number.toLong() < std::numeric_limits<int32_t>::min() ||
                                      number.toLong() > std::numeric_limits<int32_t>::max())) {
    return false;
  }
  at::Tensor y = at::empty({}, x.options());
  auto write = [&](auto value) {
    using T = decltype(value);
    *y.mutable_data_ptr<T>() = number.isFloatingPoint() ? static_cast<T>(number.toDouble())
                               : number.isBoolean()     ? static_cast<T>(number.toBool())
                                                        : static_cast<T>(number.toLong());
  };
  switch (x.scalar_type()) {
    case at::kFloat: write(float{}); break;
    case at::kDouble: write(double{}); break;
    case at::kLong: write(int64_t{}); break;
    default: write(int32_t{}); break;
  }
  return compare_into<kind>(x, y, call);
}

bool run(MaskKernel kernel, torch::jit::Stack& call) {
  switch (kernel) {
    case MaskKernel::kNone: return false;
    case MaskKernel::kWhere: return select(call);
    case MaskKernel::kEq: return compare_tensors<Comparison::kEq>(call);
    case MaskKernel::kNe: return compare_tensors<Comparison::kNe>(call);
    case MaskKernel::kLt: return compare_tensors<Comparison::kLt>(call);
    case MaskKernel::kLe: return compare_tensors<Comparison::kLe>(call);
    case MaskKernel::kGt: return compare_tensors<Comparison::kGt>(call);
    case MaskKernel::kGe: return compare_tensors<Comparison::kGe>(call);
    case MaskKernel::kEqNumber: return compare_number<Comparison::kEq>(call);
    case MaskKernel::kNeNumber: return compare_number<Comparison::kNe>(call);
    case MaskKernel::kLtNumber: return compare_number<Comparison::kLt>(call);
    case MaskKernel::kLeNumber: return compare_number<Comparison::kLe>(call);
    case MaskKernel::kGtNumber: return compare_number<Comparison::kGt>(call);
    case MaskKernel::kGeNumber: return compare_number<Comparison::kGe>(call);
  }
  return false;
}

}  // namespace

MaskKernel mask_kernel_for(const c10::OperatorName& name) {
  static const struct {
    const char* name;
    const char* overload;
    MaskKernel kernel;
  } kernels[] = {
      {"aten::where", "self", MaskKernel::kWhere},
      {"aten::eq", "Tensor", MaskKernel::kEq},       {"aten::ne", "Tensor", MaskKernel::kNe},
      {"aten::lt", "Tensor", MaskKernel::kLt},       {"aten::le", "Tensor", MaskKernel::kLe},
      {"aten::gt", "Tensor", MaskKernel::kGt},       {"aten::ge", "Tensor", MaskKernel::kGe},
      {"aten::eq", "Scalar", MaskKernel::kEqNumber}, {"aten::ne", "Scalar", MaskKernel::kNeNumber},
      {"aten::lt", "Scalar", MaskKernel::kLtNumber}, {"aten::le", "Scalar", MaskKernel::kLeNumber},
      {"aten::gt", "Scalar", MaskKernel::kGtNumber}, {"aten::ge", "Scalar", MaskKernel::kGeNumber},
  };
  for (const auto& known : kernels) {
    if (name.name == known.name && name.overload_name == known.overload) return known.kernel;
  }
  return MaskKernel::kNone;
}

bool run_mask_kernel(MaskKernel kernel, torch::jit::Stack& call) {
  const bool served = enabled.load(std::memory_order_relaxed) && run(kernel, call);
  if (served) calls_served.fetch_add(1, std::memory_order_relaxed);
  return served;
}

int64_t take_mask_kernel_calls() { return calls_served.exchange(0); }

void set_mask_kernels_enabled(bool on) { enabled.store(on, std::memory_order_relaxed); }

}  // namespace pf_native
