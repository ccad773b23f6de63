// Decomposed ops replayed in C++: a cached per-signature kernel run without a trip into Python.
//
// A keyed pf.eager session lowers an op outside its target by a kernel traced once per signature
// (eager/cache.py) and replayed in Python on every later call (keyed_kernels._replaying): the
// signature computed, the kernel's generated code run, some 15-40 us a call above the ops it
// calls. This kernel does the same in C++. It computes its own signature of the call's arguments
// (everything the Python signature keys, and grad mode), and runs the program it learned for that
// signature: the traced kernel's op calls, each through the dispatcher with the session's key
// off, as the Python replay makes them. A signature it has no program for goes to the Python
// kernel, which traces or replays it as before and answers the program for the call's signature
// (eager/graph_programs.py; the programs and their keys are kept on disk with the kernels, so
// the replay of a later process starts with them); so does any call it cannot key (a wrapped number, which the Python
// kernel turns into a tensor of the dtype eager computes it in; a tensor subclass; a generator).
// A program's ``where`` and comparisons run our CPU loops where they fit (mask_kernels.cpp).
#include "mask_kernels.h"
#include "registry.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/bit_cast.h>
#include <ATen/core/stack.h>
#include <pybind11/stl.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace pf_native {

namespace {

std::atomic<bool> replay_enabled{true};

// One argument of an instruction: a value of the program, a constant, a list of values
// (``cat``'s tensors; ``index``'s, where -1 is None) built on each call, or a number where the
// op takes a tensor (``add.Tensor(x, 3)``), made a wrapped-number tensor on each call as the
// Python replay's call makes it.
struct Argument {
  enum class Kind { kSlot, kConstant, kTensors, kOptionalTensors, kWrappedNumber };
  Kind kind = Kind::kConstant;
  int64_t slot = -1;
  c10::IValue constant;
  std::vector<int64_t> items;
};

// An op call (``op`` set) or an item of an earlier call's result (``getitem``).
struct Instruction {
  std::optional<c10::OperatorHandle> op;
  std::vector<Argument> arguments;
  size_t returns = 1;
  int64_t source = -1;  // getitem: the slot and the index
  int64_t index = 0;
  MaskKernel mask = MaskKernel::kNone;  // ``where`` or a comparison: our CPU loop where it fits
};

// Slots 0..inputs-1 hold the call's tensors in the order the Python signature walks them; each
// instruction adds one slot; ``outputs`` are the op's returns.
struct Program {
  int64_t inputs = 0;
  std::vector<Instruction> instructions;
  std::vector<Argument> outputs;
};

enum Tag : int64_t { kTensor = 1, kNone, kInt, kBool, kDouble, kString, kDevice, kList, kGrad, kSame };

// The call's signature: what the Python signature (eager/cache.py) keys, in a flat vector.
// False where a value has no key here (the call is the Python kernel's).
bool key_value(const c10::IValue& value, std::vector<int64_t>& key, std::vector<at::Tensor>& tensors) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) {
      key.push_back(kNone);
      return true;
    }
    if (!torchs_own(t) || t.unsafeGetTensorImpl()->is_wrapped_number()) {
      return false;
    }
    key.push_back(kTensor);
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(static_cast<int64_t>(t.device().type()));
    key.push_back(t.device().index());
    key.push_back(t.dim());
    for (int64_t size : t.sizes()) key.push_back(size);
    for (int64_t stride : t.strides()) key.push_back(stride);
    key.push_back(t.storage_offset());
    key.push_back(t.requires_grad() | (t.is_conj() << 1) | (t.is_neg() << 2));
    tensors.push_back(t);
    return true;
  }
  if (value.isNone()) {
    key.push_back(kNone);
  } else if (value.isBool()) {  // (before isInt: a bool is not an int here, as in Python's key)
    key.push_back(kBool);
    key.push_back(value.toBool());
  } else if (value.isInt()) {
    key.push_back(kInt);
    key.push_back(value.toInt());
  } else if (value.isDouble()) {  // by its bits: -0.0 and nan are not 0.0
    key.push_back(kDouble);
    key.push_back(c10::bit_cast<int64_t>(value.toDouble()));
  } else if (value.isString()) {
    const auto& text = value.toStringRef();
    key.push_back(kString);
    key.push_back(static_cast<int64_t>(text.size()));
    for (size_t i = 0; i < text.size(); i += 8) {
      int64_t chunk = 0;
      std::memcpy(&chunk, text.data() + i, std::min<size_t>(8, text.size() - i));
      key.push_back(chunk);
    }
  } else if (value.isDevice()) {
    key.push_back(kDevice);
    key.push_back(static_cast<int64_t>(value.toDevice().type()));
    key.push_back(value.toDevice().index());
  } else if (value.isIntList()) {
    const auto list = value.toIntList();
    key.push_back(kList);
    key.push_back(static_cast<int64_t>(list.size()));
    for (int64_t item : list) {
      key.push_back(kInt);
      key.push_back(item);
    }
  } else if (value.isList()) {  // tensors, optional tensors, floats, bools
    const auto list = value.toListRef();
    key.push_back(kList);
    key.push_back(static_cast<int64_t>(list.size()));
    for (const auto& item : list) {
      if (!key_value(item, key, tensors)) return false;
    }
  } else {  // a generator, a complex number, a tuple, an object: the Python kernel's
    return false;
  }
  return true;
}

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& key) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

c10::IValue value_of(const Argument& argument, const std::vector<c10::IValue>& values) {
  switch (argument.kind) {
    case Argument::Kind::kSlot:
      return values[argument.slot];
    case Argument::Kind::kConstant:
      return argument.constant;
    case Argument::Kind::kWrappedNumber: {
      at::Tensor number = at::scalar_to_tensor(argument.constant.toScalar());
      number.unsafeGetTensorImpl()->set_wrapped_number(true);
      return number;
    }
    case Argument::Kind::kTensors: {
      c10::List<at::Tensor> list;
      list.reserve(argument.items.size());
      for (int64_t slot : argument.items) list.push_back(values[slot].toTensor());
      return list;
    }
    case Argument::Kind::kOptionalTensors: {
      c10::List<std::optional<at::Tensor>> list;
      list.reserve(argument.items.size());
      for (int64_t slot : argument.items) {
        list.push_back(slot < 0 ? std::nullopt : std::optional<at::Tensor>(values[slot].toTensor()));
      }
      return list;
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown argument kind");
}

bool is_tensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  const auto optional = type->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == c10::TypeKind::TensorType;
}

// One argument as Python describes it (eager/graph_programs.py): (0, slot), (1, constant) or
// (2, [slot or -1, ...]), converted with the schema's type of the argument.
Argument argument_of(const py::handle& described, const c10::TypePtr& type) {
  const auto pair = described.cast<py::tuple>();
  const int kind = pair[0].cast<int>();
  Argument argument;
  if (kind == 0) {
    argument.kind = Argument::Kind::kSlot;
    argument.slot = pair[1].cast<int64_t>();
  } else if (kind == 1) {
    const PyObject* value = pair[1].ptr();
    const bool number = PyBool_Check(value) || PyLong_Check(value) || PyFloat_Check(value);
    if (number && is_tensor(type)) {
      argument.kind = Argument::Kind::kWrappedNumber;
      argument.constant = PyBool_Check(value)   ? c10::IValue(pair[1].cast<bool>())
                          : PyLong_Check(value) ? c10::IValue(pair[1].cast<int64_t>())
                                                : c10::IValue(pair[1].cast<double>());
    } else {
      argument.kind = Argument::Kind::kConstant;
      argument.constant = ivalue_of(pair[1], type);
    }
  } else {
    const auto list_type = type->cast<c10::ListType>();
    TORCH_CHECK(list_type, "a list of values where the schema takes ", type->str());
    const auto element = list_type->getElementType();
    if (element->kind() == c10::TypeKind::TensorType) {
      argument.kind = Argument::Kind::kTensors;
    } else if (element->kind() == c10::TypeKind::OptionalType &&
               element->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType) {
      argument.kind = Argument::Kind::kOptionalTensors;
    } else {
      TORCH_CHECK(false, "a list of values where the schema takes ", type->str());
    }
    for (const auto& item : pair[1].cast<py::list>()) {
      argument.items.push_back(item.cast<int64_t>());
    }
    TORCH_CHECK(argument.kind == Argument::Kind::kOptionalTensors ||
                    std::find(argument.items.begin(), argument.items.end(), -1) == argument.items.end(),
                "None in a list of tensors");
  }
  return argument;
}

// The program Python describes: (inputs, [(op name, overload, [argument, ...]), ...], [output, ...]);
// an instruction ("getitem", "", [(0, slot), (1, index)]) takes an item of an earlier result.
std::shared_ptr<const Program> program_of(const py::handle& described, const c10::FunctionSchema& schema) {
  const auto parts = described.cast<py::tuple>();
  auto program = std::make_shared<Program>();
  program->inputs = parts[0].cast<int64_t>();
  int64_t slots = program->inputs;
  for (const auto& item : parts[1].cast<py::list>()) {
    const auto described_call = item.cast<py::tuple>();
    const auto name = described_call[0].cast<std::string>();
    const auto arguments = described_call[2].cast<py::list>();
    Instruction instruction;
    if (name == "getitem") {
      instruction.source = arguments[0].cast<py::tuple>()[1].cast<int64_t>();
      instruction.index = arguments[1].cast<py::tuple>()[1].cast<int64_t>();
      TORCH_CHECK(instruction.source >= 0 && instruction.source < slots, "getitem of a later value");
    } else {
      instruction.op = operator_named(name, described_call[1].cast<std::string>());
      const auto& op_schema = instruction.op->schema();
      TORCH_CHECK(op_schema.arguments().size() == arguments.size(), "arguments of ", name, ": ",
                  arguments.size(), " for ", op_schema.arguments().size());
      for (size_t i = 0; i < arguments.size(); ++i) {
        instruction.arguments.push_back(argument_of(arguments[i], op_schema.arguments()[i].type()));
      }
      instruction.returns = op_schema.returns().size();
      instruction.mask = mask_kernel_for(op_schema.operator_name());
    }
    for (const auto& argument : instruction.arguments) {
      TORCH_CHECK(argument.slot < slots, "a value used before it is made");
      for (int64_t s : argument.items) TORCH_CHECK(s < slots, "a value used before it is made");
    }
    program->instructions.push_back(std::move(instruction));
    ++slots;
  }
  const auto outputs = parts[2].cast<py::list>();
  TORCH_CHECK(outputs.size() == schema.returns().size(), "outputs: ", outputs.size(), " for ",
              schema.returns().size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    program->outputs.push_back(argument_of(outputs[i], schema.returns()[i].type()));
    const Argument& output = program->outputs.back();
    TORCH_CHECK(output.kind != Argument::Kind::kWrappedNumber &&
                    (output.kind != Argument::Kind::kConstant || output.constant.isNone() ||
                     (output.constant.isTensor() && !output.constant.toTensor().defined())),
                "a constant output other than None");
    TORCH_CHECK(program->outputs.back().slot < slots, "an output never made");
    for (int64_t s : program->outputs.back().items) TORCH_CHECK(s < slots, "an output never made");
  }
  return program;
}

class GraphReplay final : public c10::OperatorKernel {
 public:
  GraphReplay(std::shared_ptr<std::atomic<int64_t>> served, py::object fallback, c10::DispatchKey key)
      : served_(std::move(served)), fallback_(std::move(fallback)), key_(key) {}

  // A program known before any call (learned by an earlier process, kept on disk with its key).
  void know(std::vector<int64_t> key, std::shared_ptr<const Program> program) {
    std::lock_guard<std::mutex> lock(mutex_);
    programs_.emplace(std::move(key), std::move(program));
  }


  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    std::vector<int64_t> key;
    std::vector<at::Tensor> tensors;
    key.reserve(64);
    bool keyed = replay_enabled.load(std::memory_order_relaxed);
    for (size_t i = stack->size() - n; keyed && i < stack->size(); ++i) {
      keyed = key_value((*stack)[i], key, tensors);
    }
    if (!keyed) {
      return to_python(op, stack, nullptr);
    }
    key.push_back(kGrad);
    key.push_back(at::GradMode::is_enabled());
    if (tensors.size() > 1) {  // which arguments are the same tensor: one input of the trace
      key.push_back(kSame);
      for (size_t i = 0; i < tensors.size(); ++i) {
        size_t first = i;
        for (size_t j = 0; j < i; ++j) {
          if (tensors[j].unsafeGetTensorImpl() == tensors[i].unsafeGetTensorImpl()) {
            first = j;
            break;
          }
        }
        key.push_back(static_cast<int64_t>(first));
      }
    }
    std::shared_ptr<const Program> program;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = programs_.find(key);
      if (found != programs_.end()) program = found->second;
    }
    if (!program || program->inputs != static_cast<int64_t>(tensors.size())) {
      return to_python(op, stack, &key);
    }
    run(*program, std::move(tensors), stack, n);
    served_->fetch_add(1, std::memory_order_relaxed);
  }

 private:
  void run(const Program& program, std::vector<at::Tensor> tensors, torch::jit::Stack* stack, size_t n) {
    std::vector<c10::IValue> values;
    values.reserve(program.inputs + program.instructions.size());
    for (auto& t : tensors) values.emplace_back(std::move(t));
    {
      c10::impl::ExcludeDispatchKeyGuard off(key_);  // target ops only: the backend's
      torch::jit::Stack call;
      for (const auto& instruction : program.instructions) {
        if (!instruction.op) {
          const c10::IValue& source = values[instruction.source];
          values.push_back(source.isTuple() ? source.toTupleRef().elements()[instruction.index]
                                            : source.toListRef()[instruction.index]);
          continue;
        }
        call.clear();
        for (const auto& argument : instruction.arguments) call.push_back(value_of(argument, values));
        if (instruction.mask == MaskKernel::kNone || !run_mask_kernel(instruction.mask, call)) {
          instruction.op->callBoxed(call);
        }
        if (instruction.returns == 1) {
          values.push_back(std::move(call[0]));
        } else if (instruction.returns == 0) {
          values.emplace_back();
        } else {
          values.push_back(c10::ivalue::Tuple::create(std::move(call)));
        }
      }
    }
    torch::jit::drop(*stack, n);
    for (const auto& output : program.outputs) stack->push_back(value_of(output, values));
  }

  // The Python kernel runs the call; given ``key``, it also answers the program for the call's
  // signature, kept for the next call with that key.
  void to_python(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::vector<int64_t>* key) {
    const auto& schema = op.schema();
    const size_t n = schema.arguments().size();
    py::gil_scoped_acquire gil;
    // the arguments as torch hands them to a Python kernel (a dtype as torch.dtype, not its number)
    auto [args, kwargs] = python_arguments(op.schema(), *stack);
    py::object described_key = py::none();
    if (key != nullptr) {
      py::tuple items(key->size());
      for (size_t i = 0; i < key->size(); ++i) items[i] = py::int_((*key)[i]);
      described_key = std::move(items);
    }
    py::tuple answer = fallback_(args, kwargs, described_key);
    torch::jit::drop(*stack, n);
    push_python_result(op.schema(), *stack, answer[0]);
    if (key != nullptr && !answer[1].is_none()) {
      std::shared_ptr<const Program> program;
      try {
        program = program_of(answer[1], schema);
      } catch (const std::exception&) {  // a program this kernel cannot run: the Python kernel's
        return;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      programs_.emplace(*key, std::move(program));
    }
  }

  std::shared_ptr<std::atomic<int64_t>> served_;
  PythonCallable fallback_;
  c10::DispatchKey key_;
  std::mutex mutex_;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Program>, KeyHash> programs_;
};

}  // namespace

int64_t register_graph_replay(const std::string& op_name, const std::string& op_overload,
                              const std::string& key_name, py::object fallback, const py::list& known) {
  const auto key = c10::parseDispatchKey(key_name);
  auto served = std::make_shared<std::atomic<int64_t>>(0);
  auto replay = std::make_unique<GraphReplay>(served, std::move(fallback), key);
  const auto& schema = operator_named(op_name, op_overload).schema();
  for (const auto& item : known) {  // (key, program): a program this kernel cannot run stays Python's
    const auto pair = item.cast<py::tuple>();
    try {
      replay->know(pair[0].cast<std::vector<int64_t>>(), program_of(pair[1], schema));
    } catch (const std::exception&) {
      continue;
    }
  }
  return add_registration(op_name, op_overload, key, torch::CppFunction::makeFromBoxedFunctor(std::move(replay)),
                          served);
}

void set_replay_enabled(bool enabled) { replay_enabled.store(enabled, std::memory_order_relaxed); }

}  // namespace pf_native
