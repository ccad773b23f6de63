// The module of the session's C++ kernels: the registry every kind shares, and its Python API.
#include "mask_kernels.h"
#include "registry.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <vector>

namespace pf_native {

namespace {

struct Registration {
  std::unique_ptr<torch::Library> library;
  std::shared_ptr<std::atomic<int64_t>> served;
};

std::vector<std::unique_ptr<Registration>>& registrations() {
  // never destroyed: at exit the dispatcher and the interpreter may be gone before it
  static auto* all = new std::vector<std::unique_ptr<Registration>>();
  return *all;
}

// The calls served since the last ask, and zero again.
int64_t take_served(int64_t index) {
  return registrations().at(static_cast<size_t>(index))->served->exchange(0);
}

// Unregisters one kernel (a session's ``release``); its count stays readable.
void unregister(int64_t index) {
  registrations().at(static_cast<size_t>(index))->library.reset();
}

}  // namespace

namespace {

// Whether ``type`` is ``kind`` or an optional of it.
bool is_kind(const c10::TypePtr& type, c10::TypeKind kind) {
  if (type->kind() == kind) return true;
  const auto optional = type->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == kind;
}

}  // namespace

std::pair<pybind11::tuple, pybind11::dict> python_arguments(const c10::FunctionSchema& schema,
                                                            const std::vector<c10::IValue>& stack) {
  namespace py = pybind11;
  const auto& arguments = schema.arguments();
  const size_t first = stack.size() - arguments.size();
  // arguments equal to their defaults are left out as torch leaves them out for its Python kernels
  // (the positional ones at the end, every keyword-only one), so a call's Python signature is the
  // same whichever way it came in
  auto is_default = [&](size_t i) {
    const auto& default_value = arguments[i].default_value();
    return default_value.has_value() && *default_value == stack[first + i];
  };
  size_t positional_end = 0;
  while (positional_end < arguments.size() && !arguments[positional_end].kwarg_only()) ++positional_end;
  size_t given = positional_end;
  while (given > 0 && is_default(given - 1)) --given;
  py::list positional;
  py::dict keywords;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (i < positional_end ? i >= given : is_default(i)) continue;
    const c10::IValue& value = stack[first + i];
    const auto& type = arguments[i].real_type();
    py::object converted;
    if (value.isNone()) {
      converted = py::none();
    } else if (is_kind(type, c10::TypeKind::ScalarTypeType)) {
      converted = py::cast(static_cast<c10::ScalarType>(value.toInt()));
    } else if (is_kind(type, c10::TypeKind::LayoutType)) {
      converted = py::cast(static_cast<c10::Layout>(value.toInt()));
    } else if (is_kind(type, c10::TypeKind::MemoryFormatType)) {
      converted = py::cast(static_cast<c10::MemoryFormat>(value.toInt()));
    } else {
      converted = torch::jit::toPyObject(value);
    }
    if (arguments[i].kwarg_only()) {
      keywords[py::str(arguments[i].name())] = converted;
    } else {
      positional.append(converted);
    }
  }
  return {py::tuple(positional), keywords};
}

c10::IValue ivalue_of(const pybind11::handle& value, const c10::TypePtr& type) {
  return torch::jit::toIValue(value, type);
}

void push_python_result(const c10::FunctionSchema& schema, std::vector<c10::IValue>& stack,
                        const pybind11::handle& result) {
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack.push_back(torch::jit::toIValue(result, returns[0].type()));
    return;
  }
  const auto items = result.cast<pybind11::sequence>();
  TORCH_CHECK(items.size() == returns.size(), schema.name(), ": ", items.size(), " results for ",
              returns.size(), " returns");
  for (size_t i = 0; i < returns.size(); ++i) {
    stack.push_back(torch::jit::toIValue(items[i], returns[i].type()));
  }
}

c10::OperatorHandle operator_named(const std::string& name, const std::string& overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
}

int64_t add_registration(const std::string& op_name, const std::string& op_overload, c10::DispatchKey key,
                         torch::CppFunction kernel, std::shared_ptr<std::atomic<int64_t>> served) {
  operator_named(op_name, op_overload);  // throws for an op this torch lacks
  const auto colon = op_name.find("::");
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, op_name.substr(0, colon), key,
                                                  __FILE__, __LINE__);
  const std::string qualified = op_name.substr(colon + 2) + (op_overload.empty() ? "" : "." + op_overload);
  library->impl(qualified.c_str(), std::move(kernel));
  registrations().push_back(std::make_unique<Registration>(Registration{std::move(library), std::move(served)}));
  return static_cast<int64_t>(registrations().size()) - 1;
}

}  // namespace pf_native

namespace {

// Our CPU kernel's result for ``op_name.op_overload`` on ``arguments`` (every argument of its
// schema), or None where the call is torch's kernel's: for the tests, which hold it to torch's.
pybind11::object mask_kernel_result(const std::string& op_name, const std::string& op_overload,
                                    const pybind11::tuple& arguments) {
  const auto op = pf_native::operator_named(op_name, op_overload);
  const auto kernel = pf_native::mask_kernel_for(op.schema().operator_name());
  const auto& schema_arguments = op.schema().arguments();
  TORCH_CHECK(arguments.size() == schema_arguments.size(), "arguments: ", arguments.size(), " for ",
              schema_arguments.size());
  torch::jit::Stack call;
  for (size_t i = 0; i < arguments.size(); ++i) {
    call.push_back(pf_native::ivalue_of(arguments[i], schema_arguments[i].type()));
  }
  if (!pf_native::run_mask_kernel(kernel, call)) return pybind11::none();
  return torch::jit::toPyObject(call.at(0));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mask_kernel_result", &mask_kernel_result);
  m.def("take_mask_kernel_calls", &pf_native::take_mask_kernel_calls);
  m.def("set_mask_kernels_enabled", &pf_native::set_mask_kernels_enabled);
  m.def("register_through_twin", &pf_native::register_through_twin);
  m.def("register_graph_replay", &pf_native::register_graph_replay);
  m.def("register_with_key_off", &pf_native::register_with_key_off);
  m.def("register_math_attention", &pf_native::register_math_attention);
  m.def("set_replay_enabled", &pf_native::set_replay_enabled);
  m.def("install_first_meeting", &pf_native::install_first_meeting);
  m.def("meet_through", &pf_native::meet_through);
  m.def("met_through", &pf_native::met_through);
  m.def("remove_first_meeting", &pf_native::remove_first_meeting);
  m.def("take_served", &pf_native::take_served);
  m.def("unregister", &pf_native::unregister);
}
