// The session's C++ kernels, one registry for every kind (through_twin.cpp, graph_replay.cpp, key_off.cpp,
// math_attention.cpp; the replay's mask loops, mask_kernels.cpp, register nothing).
//
// Each registration keeps the torch::Library holding its kernel (destroyed to unregister) and the
// count of calls it served, which the session adds to its statistics (``take_served``).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKeySet.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pf_native {

// A strided tensor whose memory is torch's: not a __torch_dispatch__ subclass's (a wrapper
// subclass's storage has no data pointer: ATen's overlap check throws on it, and the subclass
// decides what its writes do) nor functionalization's. Anything else is the Python kernel's.
inline bool torchs_own(const at::Tensor& t) {
  return t.layout() == c10::kStrided &&
         !t.key_set().has_any(c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize}));
}

// A Python callable a C++ kernel keeps: given back with the GIL held, or left alone once the
// interpreter is gone (at exit a kernel may outlive it).
class PythonCallable {
 public:
  explicit PythonCallable(pybind11::object callable) : callable_(std::move(callable)) {}
  ~PythonCallable() {
    if (Py_IsInitialized()) {
      pybind11::gil_scoped_acquire gil;
      callable_ = pybind11::object();
    } else {
      callable_.release();
    }
  }
  PythonCallable(const PythonCallable&) = delete;
  PythonCallable& operator=(const PythonCallable&) = delete;

  template <typename... Args>
  pybind11::object operator()(Args&&... args) const {  // (with the GIL held)
    return callable_(std::forward<Args>(args)...);
  }

 private:
  pybind11::object callable_;
};

// The operator ``name`` (``aten::add_``) with ``overload`` (``Tensor``; empty for the default).
c10::OperatorHandle operator_named(const std::string& name, const std::string& overload);

// The last ``schema.arguments()`` values of ``stack`` as torch hands them to a Python kernel:
// positional and keyword-only, trailing ones equal to their defaults left out, a dtype, layout or
// memory format as its Python object (the stack holds its number), everything else as torch
// converts it.
std::pair<pybind11::tuple, pybind11::dict> python_arguments(const c10::FunctionSchema& schema,
                                                            const std::vector<c10::IValue>& stack);

// ``value`` as the schema's ``type`` takes it (torch's own conversion, as a Python call of the op).
c10::IValue ivalue_of(const pybind11::handle& value, const c10::TypePtr& type);

// Pushes a Python kernel's ``result`` onto ``stack``: one value per return of ``schema``.
void push_python_result(const c10::FunctionSchema& schema, std::vector<c10::IValue>& stack,
                        const pybind11::handle& result);

// Registers ``kernel`` for ``op_name.op_overload`` on dispatch key ``key``; returns its index.
int64_t add_registration(const std::string& op_name, const std::string& op_overload, c10::DispatchKey key,
                         torch::CppFunction kernel, std::shared_ptr<std::atomic<int64_t>> served);

int64_t register_through_twin(const std::string& op_name, const std::string& op_overload,
                              const std::string& twin_name, const std::string& twin_overload,
                              bool twin_in_target, bool out_variant, bool resizes, const std::string& key_name,
                              pybind11::object fallback);

// ``known``: (key, program) pairs the replay starts with (learned by an earlier process).
int64_t register_graph_replay(const std::string& op_name, const std::string& op_overload,
                              const std::string& key_name, pybind11::object fallback, const pybind11::list& known);

// An op of the target whose inner calls are the backend's: run again with ``key_name`` excluded.
int64_t register_with_key_off(const std::string& op_name, const std::string& op_overload,
                              const std::string& key_name);

// sdpa's composite with the fused backends off on ``devices`` (types: "cpu", "cuda"), on ``key_name``.
int64_t register_math_attention(const std::string& key_name, const std::vector<std::string>& devices);

// The key's fallback (first_meeting.cpp): an op first reaching ``key_name`` gets its fallthrough
// there, unless named in ``with_kernel``: then ``meet(name)`` registers its kernel, called next.
void install_first_meeting(const std::string& key_name, const std::vector<std::string>& with_kernel,
                           pybind11::object meet);
// Gives the op its fallthrough now (a Python meeting of it); false where it has a kernel of ours.
bool meet_through(const std::string& op_name, const std::string& op_overload);
// Whether the fallback gave the op (``aten::add.Tensor``) its fallthrough.
bool met_through(const std::string& qualified);
// Unregisters the fallback and every fallthrough it gave.
void remove_first_meeting();

// Whether the graph replays serve calls (a session with ``use_cache=False`` turns them off).
void set_replay_enabled(bool enabled);

}  // namespace pf_native
