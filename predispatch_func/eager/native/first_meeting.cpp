// The session key's fallback, in C++: the first call of each op that reaches the key.
//
// Each op reaching the session's key with nothing registered for it is met once
// (session_key._Registered.meet): an op with a kernel of ours gets it, every other op (the
// target's, views torch's composite kernel makes, what is not ours to lower) a fallthrough. Met by
// a Python fallback, every first call was a trip into Python with its arguments converted, about
// 100 us each: a small transformer's first step meets some forty ops that only fall through,
// 4 ms of a 20 ms cold start. This fallback gives those their fallthrough here and sends the call
// on below the key; only an op named as having a kernel of ours (``with_kernel``) goes to Python,
// by name (``meet``), and the call is then dispatched again to the kernel just registered.
#include "registry.h"

#include <ATen/core/stack.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace pf_native {

namespace {

std::string qualified_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// What one registered fallback knows: the ops it sends to Python, and the fallthroughs it gave.
class Meeting {
 public:
  Meeting(c10::DispatchKey key, std::unordered_set<std::string> with_kernel, py::object meet)
      : key_(key), with_kernel_(std::move(with_kernel)), meet_(std::move(meet)) {}

  // Gives ``op`` its fallthrough on the key, once; false where it has a kernel of ours instead.
  bool give_fallthrough(const c10::OperatorHandle& op) {
    const std::string name = qualified_name(op.operator_name());
    if (with_kernel_.count(name)) return false;
    std::lock_guard<std::mutex> hold(mutex_);  // (never held while waiting for the GIL)
    if (!through_.insert(name).second) return true;
    const auto colon = name.find("::");
    const std::string space = name.substr(0, colon);
    auto& library = libraries_[space];
    if (!library) {
      library = std::make_unique<torch::Library>(torch::Library::IMPL, space, key_, __FILE__, __LINE__);
    }
    library->impl(name.substr(colon + 2).c_str(), torch::CppFunction::makeFallthrough());
    return true;
  }

  bool gave_fallthrough(const std::string& name) {
    std::lock_guard<std::mutex> hold(mutex_);
    return through_.count(name) > 0;
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    if (give_fallthrough(op)) {  // on to the keys below, as its fallthrough sends every later call
      op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, key_), stack);
      return;
    }
    {
      py::gil_scoped_acquire gil;
      meet_(qualified_name(op.operator_name()));
    }
    TORCH_CHECK(op.hasKernelForDispatchKey(key_), qualified_name(op.operator_name()),
                ": met, but no kernel of the session was registered for it");
    op.redispatchBoxed(keys, stack);  // to the kernel just registered on the key
  }

 private:
  c10::DispatchKey key_;
  const std::unordered_set<std::string> with_kernel_;
  PythonCallable meet_;
  std::mutex mutex_;
  std::unordered_set<std::string> through_;
  std::unordered_map<std::string, std::unique_ptr<torch::Library>> libraries_;  // by namespace
};

// The boxed fallback torch calls; the Meeting it serves is owned by ``current``.
class Fallback final : public c10::OperatorKernel {
 public:
  explicit Fallback(std::shared_ptr<Meeting> meeting) : meeting_(std::move(meeting)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    (*meeting_)(op, keys, stack);
  }

 private:
  std::shared_ptr<Meeting> meeting_;
};

struct Installed {
  std::shared_ptr<Meeting> meeting;
  std::unique_ptr<torch::Library> library;  // holds the fallback
};

std::mutex installed_mutex;
Installed* installed = nullptr;  // one fallback per key at a time (torch allows no more)

std::shared_ptr<Meeting> current() {
  std::lock_guard<std::mutex> hold(installed_mutex);
  TORCH_CHECK(installed != nullptr, "no first-meeting fallback is installed");
  return installed->meeting;
}

}  // namespace

void install_first_meeting(const std::string& key_name, const std::vector<std::string>& with_kernel,
                           py::object meet) {
  const auto key = c10::parseDispatchKey(key_name);
  auto meeting = std::make_shared<Meeting>(
      key, std::unordered_set<std::string>(with_kernel.begin(), with_kernel.end()), std::move(meet));
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "_", key, __FILE__, __LINE__);
  library->fallback(torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Fallback>(meeting)));
  std::lock_guard<std::mutex> hold(installed_mutex);
  TORCH_CHECK(installed == nullptr, "a first-meeting fallback is installed already");
  installed = new Installed{std::move(meeting), std::move(library)};
}

bool meet_through(const std::string& op_name, const std::string& op_overload) {
  return current()->give_fallthrough(operator_named(op_name, op_overload));
}

bool met_through(const std::string& qualified) {
  return current()->gave_fallthrough(qualified);
}

void remove_first_meeting() {
  Installed* removed = nullptr;
  {
    std::lock_guard<std::mutex> hold(installed_mutex);
    std::swap(removed, installed);
  }
  delete removed;  // the fallback and every fallthrough unregistered
}

}  // namespace pf_native
