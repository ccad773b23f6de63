"""Every lying composite that torch 2.13's export would keep, exported by us and replayed.

For each one, a module calls the op on the sample that made it lie, then
mutates every result that aliases an input in place. Eager sees the write
reach the input; torch's functional graphs would drop it; ours must equal eager.
"""

import pytest
import torch
from torch.utils import _pytree as pytree

from predispatch_func import _torch_compat as tc
from predispatch_func.artifacts import program_facts
from predispatch_func.errors import ExportError, UnsupportedError
from predispatch_func.schema_audit.checker import _aliases as aliases  # sparse-aware: indices, values
from predispatch_func.schema_audit.checker import run_sample
from predispatch_func.schema_audit.sample_sources import samples_for
from predispatch_func.schema_audit.table import load
from predispatch_func.trace.composite_policy import HONEST_TWINS
from tests.support.reference import export_checked
from tests.support.torch_release import torch_limit

TABLE = load()
LYING_KEPT_BY_TORCH = sorted(e.op for e in TABLE.entries.values() if e.composite and e.lies and e.torch_keeps)


def _op(name: str) -> torch._ops.OpOverload:
    ns, _, rest = name.partition(".")
    return tc.resolve_overload(ns, rest)


def _lying_sample(op):
    """The first sample on which ``op`` lies and on which eager can write the aliased result."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        samples, _ = samples_for(op)
        for s in samples:
            try:
                run = run_sample(op, s)
                if not (run.alias_lies or run.mutation_lies):
                    continue
                args, kwargs = s.materialize()
                CallThenMutate(op, s)([v for v in pytree.tree_leaves((args, kwargs))
                                       if isinstance(v, torch.Tensor)])
            except Exception:
                continue  # eager itself refuses (e.g. the alias is an expanded view)
            return s
    raise AssertionError(f"no sample makes {op} lie any more; rebuild the audit table")


def _mutate_in_place(t: torch.Tensor) -> None:
    if t.dtype == torch.bool:
        t.logical_not_()
    elif t.is_floating_point() or t.is_complex():
        t.mul_(3)
    else:
        t.add_(1)


class CallThenMutate(torch.nn.Module):
    """``out = op(*sample)``; then every result that aliases an input is written in place."""

    def __init__(self, op, sample):
        super().__init__()
        self.op = op
        leaves, self.spec = pytree.tree_flatten((sample.args, sample.kwargs))
        self.is_tensor = [isinstance(v, torch.Tensor) for v in leaves]
        self.constants = [None if t else v for t, v in zip(self.is_tensor, leaves)]
        self.to_mutate = self._aliasing_results(sample)

    def _call(self, tensors):
        it = iter(tensors)
        leaves = [next(it) if t else c for t, c in zip(self.is_tensor, self.constants)]
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op(*args, **kwargs)

    def _aliasing_results(self, sample) -> list[int]:
        """Which result leaves alias an input, found eagerly (tracing hides storages)."""
        args, kwargs = sample.materialize()
        tensors = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        return [i for i, o in enumerate(pytree.tree_leaves(self._call(tensors)))
                if isinstance(o, torch.Tensor) and any(aliases(o, x) for x in tensors)]

    def forward(self, tensors: list[torch.Tensor]):
        out = self._call(tensors)
        leaves = pytree.tree_leaves(out)
        for i in self.to_mutate:
            _mutate_in_place(leaves[i])
        return out


def test_the_list_holds_the_known_liars():
    for name in ("aten.type_as.default", "aten.einsum.default", "aten.sum_to_size.default",
                 "aten.dropout.default"):
        assert name in LYING_KEPT_BY_TORCH


# Cases torch itself blocks; each is a clear error or a documented torch limit.
TORCH_BLOCKS = {
    "aten.chalf.default": (NotImplementedError, "it lies only on complex32 inputs, and torch has no "
                           "CPU equal/allclose for complex32, so no replay can compare the values"),
    "aten._saturate_weight_to_fp16.default": (ExportError, "its C++ composite reads raw tensor data, "
                                              "which fake tensors do not have; export names the op"),
    "aten.fbgemm_pack_gemm_matrix_fp16.default": (ExportError, "like _saturate_weight_to_fp16 (which it "
                                                  "calls on its input), its C++ composite reads raw "
                                                  "tensor data, which fake tensors do not have; export "
                                                  "names the op"),
    # lies the audit finds only with sparse tensors (schema_audit/layouts.py, recipes.py)
    "aten.to_sparse.sparse_dim": (UnsupportedError, "it returns a COO input itself; the write to that "
                                  "sparse result is refused (Refusal.WRITE_TO_SPARSE), not dropped"),
    "aten.to_sparse_bsr.default": (NotImplementedError, "it lies only on a BSR input, which torch cannot "
                                   "deep-copy (the reference replay copies the inputs: 'Cannot access storage of "
                                   "SparseCsrTensorImpl'), as to_sparse_csc below"),
    "aten.to_sparse_bsc.default": (NotImplementedError, "it lies only on a BSC input, which torch cannot "
                                   "deep-copy, as to_sparse_bsr"),
    "aten.to_sparse_csr.default": (ExportError, "it lies only on a sparse CSR input, which torch "
                                   "2.13's functionalization cannot wrap ('Sparse CSR tensors do not "
                                   "have strides'); export names the op"),
    "aten.to_sparse_csc.default": (NotImplementedError, "it lies only on a sparse CSC input, which "
                                   "torch 2.13 cannot deep-copy (the reference replay copies the inputs: 'Cannot "
                                   "access storage of SparseCsrTensorImpl'); its CSR twin above exports "
                                   "to a clear error"),
    "aten.gather_backward.default": (UnsupportedError, "its sparse_grad=True result's values view "
                                     "grad (as _gather_sparse_backward's do); the write to that sparse "
                                     "result is refused (Refusal.WRITE_TO_SPARSE), not dropped"),
    "aten._gather_sparse_backward.default": (UnsupportedError, "a sparse result whose values view "
                                             "grad; the write to it is refused (WRITE_TO_SPARSE)"),
    "aten.instance_norm.default": (ExportError, "torch's Python decomposition of "
                                   "_native_batch_norm_legit divides by n-1 = 0 for one element per "
                                   "channel (eager gives inf); see test_instance_norm_running_stats"),
}


def _case(name):
    if name not in TORCH_BLOCKS:
        return name
    exc, reason = TORCH_BLOCKS[name]
    if exc is UnsupportedError:  # our own refusal, not torch's limit
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, raises=exc, reason=reason))
    return pytest.param(name, marks=torch_limit(reason, raises=exc))


@pytest.mark.parametrize("name", [_case(n) for n in LYING_KEPT_BY_TORCH])
def test_lying_composite_then_inplace_equals_eager(name):
    op = _op(name)
    sample = _lying_sample(op)
    model = CallThenMutate(op, sample)
    args, kwargs = sample.materialize()
    tensors = tuple(v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor))
    ep = export_checked(model, (list(tensors),))
    decisions = program_facts(ep.graph_module).composite_decisions
    if op in HONEST_TWINS:  # traced as the op that declares its alias (x.data -> detach)
        assert name not in decisions and str(HONEST_TWINS[op]) in str(ep.graph_module.graph)
    else:
        assert decisions[name][0] == "decompose", decisions


class InstanceNormWithStats(torch.nn.Module):
    def forward(self, x, weight, bias, running_mean, running_var):
        y = torch.ops.aten.instance_norm.default(x, weight, bias, running_mean, running_var,
                                                 True, 0.1, 1e-5, False)
        return y


def test_instance_norm_running_stats_written_back():
    """instance_norm updates running stats its schema does not mark written; ours writes them back."""
    args = (torch.randn(2, 3, 4), torch.rand(3), torch.rand(3), torch.zeros(3), torch.ones(3))
    ep = export_checked(InstanceNormWithStats(), args)
    kinds = [s.kind.name for s in ep.graph_signature.output_specs]
    assert kinds.count("USER_INPUT_MUTATION") == 2, kinds


class UnsafeSplitThenInplace(torch.nn.Module):
    def __init__(self, split):
        super().__init__()
        self.split = split

    def forward(self, x):
        first, second = self.split(x)
        first.mul_(3)
        return second + 1


@pytest.mark.parametrize("split", [
    lambda x: torch.ops.aten.unsafe_split.Tensor(x, 1),
    lambda x: torch.ops.aten.unsafe_split_with_sizes.default(x, [1, 1]),
    lambda x: torch.ops.aten.unsafe_chunk.default(x, 2),  # a composite that calls unsafe_split
], ids=["unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk"])
def test_lying_kernel_unsafe_split_then_inplace_equals_eager(split):
    """unsafe_split is a kernel (no composite to decompose) whose schema hides its views."""
    assert TABLE.entries["aten.unsafe_split.Tensor"].verdict == "lies_alias"
    ep = export_checked(UnsafeSplitThenInplace(split), (torch.randn(2),))
    assert "unsafe_split" not in ep.graph_module.code
    assert ep.graph_signature.output_specs[0].kind.name == "USER_INPUT_MUTATION"
