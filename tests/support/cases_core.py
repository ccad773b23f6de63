"""The edge-case catalogue of the core exporter: one tiny module per behaviour.

Each case is a factory returning ``(model, args, kwargs)``, registered under
the name of the behaviour it pins down. The tests of the stage each case is
about (``export_case``; tests/test_catalogue.py checks that every case has one) export
each case, snapshot its graph and replay it against the reference;
``scripts/compare_torch_paths.py`` runs the same cases through torch's own
functional entry points, so both tables are about exactly the same programs.

Factories build fresh modules and inputs on every call, from a fixed seed,
so a case can be exported, replayed and compared any number of times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from predispatch_func.errors import Refusal

Built = tuple[nn.Module, tuple, dict]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Built]
    # False where the program draws random numbers differently from eager (dropout)
    check_values: bool = True
    refused: Refusal | None = None  # the kind of UnsupportedError the exporter must raise


CASES: dict[str, Case] = {}
# what the exporter must refuse with a clear UnsupportedError (contract point 8)
REFUSED: dict[str, Case] = {}


def case(*, check_values: bool = True, refused: Refusal | None = None
         ) -> Callable[[Callable[[], Built]], Callable[[], Built]]:
    def register(factory: Callable[[], Built]) -> Callable[[], Built]:
        def seeded() -> Built:
            torch.manual_seed(0)
            return factory()
        table = REFUSED if refused is not None else CASES
        assert factory.__name__ not in CASES and factory.__name__ not in REFUSED, factory.__name__
        table[factory.__name__] = Case(factory.__name__, seeded, check_values, refused)
        return seeded
    return register


def build(name: str) -> Built:
    return CASES[name].build()


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


# --- in-place on inputs -------------------------------------------------------------


@case()
def inplace_add_on_input() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2
    return M(), (_r(3),), {}


@case()
def inplace_on_two_inputs_in_order() -> Built:
    class M(nn.Module):
        def forward(self, x, y):
            x.mul_(2)
            y.sub_(x)
            return x + y
    return M(), (_r(3), _r(3)), {}


@case()
def inplace_on_integer_input() -> Built:
    class M(nn.Module):
        def forward(self, x, steps):
            steps.add_(1)
            return x * steps
    return M(), (_r(3), torch.arange(3)), {}


@case()
def input_read_before_mutation() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(_r(3))

        def forward(self, x):
            y = x + self.w
            x.mul_(3)
            return y, x * self.w
    return M(), (_r(3),), {}


@case()
def relu_inplace_on_input() -> Built:
    class M(nn.Module):
        def forward(self, x):
            F.relu(x, inplace=True)
            return x.sum()
    return M(), (_r(5),), {}


@case()
def out_argument_into_input() -> Built:
    class M(nn.Module):
        def forward(self, x, y):
            torch.mul(x, 3, out=y)
            return y + x
    return M(), (_r(3), _r(3)), {}


# --- mutation through views ------------------------------------------------------------


@case()
def mutation_through_index_view() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x[0].mul_(2)
            return x + 1
    return M(), (_r(3, 4),), {}


@case()
def mutation_through_transpose() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.transpose(0, 1)[1].add_(5)
            return x.sum(0)
    return M(), (_r(3, 4),), {}


@case()
def inplace_view_op_then_shape_read() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.t_()  # relays the input itself: what follows must see its new shape
            return x.reshape(x.shape[0], -1) * 2
    return M(), (_r(2, 3),), {}


@case()
def mutation_through_strided_slice() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x[:, ::2].mul_(-1)
            return x.clone()
    return M(), (_r(3, 6),), {}


@case()
def mutation_through_diagonal() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.diagonal().fill_(0)
            return x.exp()
    return M(), (_r(4, 4),), {}


@case()
def mutation_through_view_of_view() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.view(-1)[2:5].zero_()
            return x * x
    return M(), (_r(2, 4),), {}


@case()
def mutation_through_unsqueeze_and_expand_read() -> Built:
    class M(nn.Module):
        def forward(self, x):
            v = x.unsqueeze(0)
            v[0, 1].add_(1)
            return v.expand(2, 3).sum(0)
    return M(), (_r(3),), {}


# --- several aliases of one input ---------------------------------------------------


@case()
def two_aliases_of_one_input_both_mutated() -> Built:
    class M(nn.Module):
        def forward(self, x):
            a = x.view(2, 3)
            b = x[1:]
            a.add_(1)
            b.mul_(2)
            return a.sum() + b.sum()
    return M(), (_r(6),), {}


@case()
def alias_mutated_other_alias_read_after() -> Built:
    class M(nn.Module):
        def forward(self, x):
            t = x.t()
            row = x[0]
            t.mul_(2)
            return row * 1
    return M(), (_r(3, 3),), {}


@case()
def overlapping_inputs_read_only() -> Built:
    class M(nn.Module):
        def forward(self, x, y, z):
            return x[1:] * y + z
    x = _r(4)
    return M(), (x, x[1:], x[1:]), {}


# --- outputs and inputs that alias ----------------------------------------------------


@case()
def outputs_are_views_of_input() -> Built:
    class M(nn.Module):
        def forward(self, x):
            return x.view(-1), x[0], x.t()
    return M(), (_r(2, 3),), {}


@case()
def same_tensor_returned_twice() -> Built:
    class M(nn.Module):
        def forward(self, x):
            y = x.sin()
            return y, y
    return M(), (_r(3),), {}


@case()
def input_returned_unchanged() -> Built:
    class M(nn.Module):
        def forward(self, x, y):
            return x, y * 2
    return M(), (_r(3), _r(3)), {}


@case()
def mutated_input_also_returned() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.add_(1)
            return x
    return M(), (_r(3),), {}


@case()
def mutated_input_returned_as_view() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.mul_(2)
            return x.view(3, 2)[1]
    return M(), (_r(6),), {}


@case()
def output_view_taken_before_mutation() -> Built:
    class M(nn.Module):
        def forward(self, x):
            row = x[0]
            x.mul_(2)
            return row
    return M(), (_r(2, 3),), {}


@case()
def written_buffer_returned_as_view() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.zeros(2, 3))

        def forward(self, x):
            self.b.add_(x)
            return self.b[1], self.b.t()
    return M(), (_r(2, 3),), {}


@case()
def parameter_written_under_no_grad_returned_as_view() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4))

        def forward(self, x):
            with torch.no_grad():
                self.w.clamp_(-0.5, 0.5)
            return self.w[1:] * x[1:], self.w[:2], self.w.detach()[::2]
    return M(), (_r(4),), {}


@case()
def intermediate_copied_into_buffer_returned_as_view() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.zeros(3))

        def forward(self, x):
            v = x * 2
            self.b.copy_(v)  # the buffer takes v's values, not its memory: v[1:] is no view of b
            return v[1:], self.b[:1]
    return M(), (_r(3),), {}


class _RunningStats(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))


@case()
def batch_norm_out_variant_writes_running_stats() -> Built:
    """``native_batch_norm.out`` in training: functionalization turned it into
    ``native_batch_norm``, whose kernel writes the running statistics its schema does not mark."""
    class M(_RunningStats):
        def forward(self, x, out, save_mean, save_invstd):
            torch.ops.aten.native_batch_norm.out(x, None, None, self.mean, self.var, True, 0.1, 1e-5,
                                                 out=out, save_mean=save_mean, save_invstd=save_invstd)
            return out * 2, save_mean
    return M(), (_r(3, 4, 5), torch.zeros(3, 4, 5), torch.zeros(4), torch.zeros(4)), {}  # not empty: NaN != NaN


@case()
def batch_norm_update_stats_writes_running_stats() -> Built:
    """``batch_norm_update_stats``: its kernel writes the running statistics, its schema says nothing."""
    class M(_RunningStats):
        def forward(self, x):
            mean, var = torch.batch_norm_update_stats(x, self.mean, self.var, 0.1)
            return (x - mean.view(1, 4, 1)) / (var.view(1, 4, 1) + 1e-5).sqrt()
    return M(), (_r(3, 4, 5),), {}


# --- intermediates ----------------------------------------------------------------------


@case()
def intermediate_mutated_through_view() -> Built:
    class M(nn.Module):
        def forward(self, x):
            y = x * 2
            y[1:].add_(10)
            return y
    return M(), (_r(4),), {}


@case()
def intermediate_mutated_through_transpose_with_param() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(_r(3))

        def forward(self, x):
            y = x.clone()
            y.t()[0].mul_(self.w)
            return y
    return M(), (_r(3, 2),), {}


@case()
def intermediate_view_taken_before_mutation() -> Built:
    class M(nn.Module):
        def forward(self, x):
            y = x * 1
            v = y.t()
            y.add_(1)
            return v
    return M(), (_r(2, 3),), {}


# --- buffers ---------------------------------------------------------------------------


@case()
def buffer_counter() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            self.calls.add_(1)
            return x * self.calls
    return M(), (_r(3),), {}


@case()
def buffer_accumulator() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3))

        def forward(self, x):
            self.total.add_(x.detach())
            return x * self.total
    return M(), (_r(3),), {}


@case()
def non_persistent_buffer_mutated_through_view() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(2, 3), persistent=False)

        def forward(self, x):
            self.cache[0].copy_(x.detach())
            return self.cache.sum(0) + x
    return M(), (_r(3),), {}


@case()
def buffer_ema_with_lerp() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.register_buffer("ema", torch.zeros(3))

        def forward(self, x):
            y = self.lin(x)
            self.ema.lerp_(y.detach().mean(0), 0.1)
            return y - self.ema
    return M(), (_r(4, 3),), {}


@case()
def buffer_reassigned_in_forward() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(3))

        def forward(self, x):
            self.seen = self.seen + x.detach()  # assignment, not in place: eager keeps it
            return x * self.seen
    return M(), (_r(3),), {}


# --- norm layers and dropout -------------------------------------------------------------


@case()
def batchnorm_train() -> Built:
    return nn.BatchNorm1d(3).train(), (_r(4, 3),), {}


@case()
def batchnorm_called_twice_train() -> Built:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            return self.bn(self.bn(x) * 2)
    return M().train(), (_r(4, 3),), {}


@case()
def batchnorm_eval() -> Built:
    m = nn.BatchNorm1d(3)
    m.running_mean.uniform_()
    m.running_var.uniform_(0.5, 2)
    return m.eval(), (_r(4, 3),), {}


@case()
def conv_batchnorm2d_train() -> Built:
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)).train(), (_r(2, 2, 5, 5),), {}


@case(check_values=False)
def dropout_train() -> Built:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train(), (_r(2, 4),), {}


@case()
def functional_dropout_eval_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            y = F.dropout(x, 0.5, training=False)  # eager returns x itself
            y.add_(1)
            return y * 2
    return M(), (_r(3),), {}


@case()
def functional_dropout_p0_train_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            y = F.dropout(x, 0.0, training=True)  # eager returns x itself
            y.mul_(3)
            return y + x
    return M(), (_r(3),), {}


@case()
def dropout_eval_is_identity() -> Built:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).eval(), (_r(2, 4),), {}


# --- honest composites, kept as single nodes -------------------------------------------------


@case()
def linear_kept() -> Built:
    return nn.Linear(4, 3), (_r(2, 4),), {}


@case()
def layer_norm_kept() -> Built:
    return nn.LayerNorm(4), (_r(2, 4),), {}


@case()
def softmax_kept() -> Built:
    class M(nn.Module):
        def forward(self, x):
            return x.softmax(-1)
    return M(), (_r(2, 5),), {}


@case()
def scaled_dot_product_attention_kept() -> Built:
    class M(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return M(), (_r(1, 2, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8)), {}


# --- composites that return their input: the in-place op after them must reach it ------------


@case()
def type_as_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x, z):
            y = x.type_as(z)
            y.mul_(3)
            return y + 1
    return M(), (_r(3), _r(3)), {}


@case()
def type_as_other_dtype_then_inplace_leaves_input() -> Built:
    class M(nn.Module):
        def forward(self, x, z):
            y = x.type_as(z)
            y.mul_(3)
            return y
    return M(), (_r(3), _r(3).double()), {}


@case()
def einsum_transpose_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            y = torch.einsum("ij->ji", x)
            y.add_(1)
            return y * 2
    return M(), (_r(2, 3),), {}


@case()
def einsum_identity_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            torch.einsum("i->i", x).add_(1)
            return x * 2
    return M(), (_r(3),), {}


@case()
def einsum_diagonal_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            torch.einsum("ii->i", x).add_(1)
            return x * 2
    return M(), (_r(3, 3),), {}


@case()
def einsum_contraction_kept_next_to_a_transpose() -> Built:
    """One op, two calls: the contraction is honest (kept as one node), the
    transpose aliases its input (decomposed), each written in place after."""
    class M(nn.Module):
        def forward(self, x, w):
            y = torch.einsum("bij,bjk->bik", x, w)
            y.add_(1)
            t = torch.einsum("bij->bji", x)
            t.mul_(2)
            return y, x * 1
    return M(), (_r(2, 3, 4), _r(2, 4, 5)), {}


@case()
def inplace_activations_with_python_meta_kernels() -> Built:
    """In-place activations whose Meta kernel is torch's Python one (relu6 as hardtanh_,
    hardswish_, hardsigmoid_, leaky_relu_, elu_): on an intermediate, on a view of an
    input (written back), on the input itself, and under no_grad on a leaf's view."""
    class M(nn.Module):
        def forward(self, x, y, w):
            a = F.relu6(x * 2, inplace=True)
            F.hardswish(y[:, 1:], inplace=True)
            b = F.hardsigmoid(a + 1, inplace=True)
            F.leaky_relu(y, 0.2, inplace=True)
            with torch.no_grad():
                F.elu(w.detach()[0], inplace=True)
            return a * b, y * 1, w * 3
    return M(), (_r(2, 3), _r(2, 4), _r(2, 3).requires_grad_()), {}


@case()
def sum_to_size_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            y = x.sum_to_size(x.shape)
            y.sub_(1)
            return y.sum()
    return M(), (_r(2, 3),), {}


@case()
def reshape_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.reshape(-1)[0].fill_(7)
            return x + 0
    return M(), (_r(2, 3),), {}


@case()
def to_same_dtype_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.to(torch.float32).mul_(2)
            return x.cos()
    return M(), (_r(3),), {}


@case()
def contiguous_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.contiguous().add_(4)
            return x.neg()
    return M(), (_r(2, 2),), {}


@case()
def flatten_1d_then_inplace() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x.flatten().mul_(5)
            return x.tanh()
    return M(), (_r(4),), {}


# --- kwargs, nested inputs and outputs ----------------------------------------------------------


@case()
def kwargs_with_default() -> Built:
    class M(nn.Module):
        def forward(self, x, *, scale, shift=None):
            y = x * scale
            return y if shift is None else y + shift
    return M(), (_r(3),), {"scale": _r(3), "shift": _r(3)}


@case()
def nested_tuple_and_dict_inputs() -> Built:
    class M(nn.Module):
        def forward(self, pair, table):
            a, (b, c) = pair
            return a * table["w"] + b - c * table["inner"]["v"]
    return M(), ((_r(2), (_r(2), _r(2))), {"w": _r(2), "inner": {"v": _r(2)}}), {}


@case()
def non_tensor_inputs() -> Built:
    class M(nn.Module):
        def forward(self, x, k, scale, flag, nothing):
            return x * k * scale if flag and nothing is None else x
    return M(), (_r(3), 2, 0.5, True, None), {}


@case()
def nested_outputs() -> Built:
    class M(nn.Module):
        def forward(self, x):
            return {"pair": (x + 1, x * 2), "list": [x.sum()], "n": 3}
    return M(), (_r(3),), {}


@case()
def mutation_of_input_inside_dict() -> Built:
    class M(nn.Module):
        def forward(self, table):
            table["state"].add_(table["delta"])
            return table["state"] * 2
    return M(), ({"state": _r(3), "delta": _r(3)},), {}


# --- indexed writes into inputs -------------------------------------------------------------


@case()
def index_put_into_input() -> Built:
    class M(nn.Module):
        def forward(self, x, idx, v):
            x.index_put_((idx,), v, accumulate=True)
            return x * 1
    return M(), (_r(5), torch.tensor([0, 2, 2]), _r(3)), {}


@case()
def setitem_with_index_tensor_into_input() -> Built:
    class M(nn.Module):
        def forward(self, x, idx, v):
            x[idx] = v
            return x.sum(-1)
    return M(), (_r(4, 3), torch.tensor([3, 1]), _r(2, 3)), {}


@case()
def setitem_scalar_into_input_column() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x[:, 1] = 0.0
            return x.sum(0)
    return M(), (_r(3, 3),), {}


@case()
def index_add_into_input() -> Built:
    class M(nn.Module):
        def forward(self, x, idx, src):
            x.index_add_(0, idx, src, alpha=2)
            return x.mean()
    return M(), (_r(4, 2), torch.tensor([1, 1, 3]), _r(3, 2)), {}


@case()
def scatter_into_input() -> Built:
    class M(nn.Module):
        def forward(self, x, idx, src):
            x.scatter_(1, idx, src)
            return x.relu()
    return M(), (_r(2, 4), torch.tensor([[0, 3], [1, 2]]), _r(2, 2)), {}


@case()
def masked_assignment_into_input() -> Built:
    class M(nn.Module):
        def forward(self, x):
            x[x < 0] = 0.5
            x.masked_fill_(x > 1, 1.0)
            return x * 3
    return M(), (_r(6),), {}


@case()
def copy_into_input_slice() -> Built:
    class M(nn.Module):
        def forward(self, x, y):
            x[1:3].copy_(y)
            return x + 1
    return M(), (_r(4, 2), _r(2, 2)), {}


# --- small models ---------------------------------------------------------------------------


class TinyBlock(nn.Module):
    """Pre-norm attention + MLP, as in a transformer layer."""

    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


@case()
def mlp_two_layers() -> Built:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (_r(3, 4),), {}


@case()
def tiny_transformer_block() -> Built:
    return TinyBlock(), (_r(2, 5, 8),), {}


@case()
def tensor_constant_created_in_forward() -> Built:
    class M(nn.Module):
        def forward(self, x):
            return x * torch.tensor([1.0, 2.0, 3.0])
    return M(), (_r(3),), {}


# --- refused: no functional program can say this; eager-equal or a clear error ------------------


@case(refused=Refusal.WRITE_TO_ALIASED_INPUTS)
def write_to_input_aliased_with_another_dtype() -> Built:
    """(one input passed twice, or overlapping views, are carried: tests/state/test_aliased_inputs.py)"""
    class M(nn.Module):
        def forward(self, x, y):
            x.add_(1)
            return y * 2
    x = _r(3)
    return M(), (x, x.view(torch.int32)), {}


def all_cases() -> list[Case]:
    return list(CASES.values())
