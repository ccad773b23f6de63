"""A parameter or buffer registered under several names (tied weights, a module shared by
two parents) keeps every name in the program, as in ``model.state_dict()`` and as
torch.export keeps them, while the graph reads one placeholder per tensor: so
``ep.module().load_state_dict(model.state_dict())`` works, and so does exporting on
``meta`` then loading real weights with ``assign=True``."""

import io

import torch

import predispatch_func as pf
from tests.support.reference import export_checked
from tests.support.torch_release import torch_limit


class TiedHead(torch.nn.Module):
    """What ``tie_word_embeddings`` does, plus a buffer shared by two submodules."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.norm = torch.nn.Module()
        self.norm.register_buffer("scale", torch.full((4,), 0.5))
        self.other = torch.nn.Module()
        self.other.register_buffer("scale", self.norm.scale)

    def forward(self, ids):
        return self.head(self.emb(ids) * self.norm.scale)


def _ids():
    return torch.tensor([[1, 2, 3], [4, 5, 6]])


def test_every_name_of_a_tied_tensor_is_in_the_program():
    model = TiedHead()
    ep = export_checked(model, (_ids(),))
    assert sorted(ep.state_dict) == sorted(model.state_dict())
    assert ep.state_dict["head.weight"] is ep.state_dict["emb.weight"]
    # every name is an input, as torch.export lists them; the graph reads the first name only
    specs = [s for s in ep.graph_signature.input_specs if s.target is not None]
    assert [s.target for s in specs] == ["emb.weight", "head.weight", "norm.scale", "other.scale"]
    placeholder = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    assert [s.target for s in specs if placeholder[s.arg.name].users] == ["emb.weight", "norm.scale"]
    program = ep.module()
    assert sorted(program.state_dict()) == sorted(model.state_dict())
    assert program.head.weight is program.emb.weight
    assert program.other.scale is program.norm.scale


def test_module_loads_the_models_state_dict_and_its_changed_weights():
    model, ids = TiedHead(), _ids()
    program = export_checked(model, (ids,)).module()
    with torch.no_grad():
        model.emb.weight.mul_(-3)  # through either name: they are one tensor
        model.norm.scale.fill_(2.0)
    program.load_state_dict(model.state_dict())  # strict: every key on both sides
    torch.testing.assert_close(program(ids), model(ids))


@torch_limit("FakeTensor refuses meta weights beside CPU inputs ('Unhandled FakeTensor Device "
             "Propagation ... found two different devices meta, cpu')", lifted_in=(2, 13))
def test_exported_on_meta_then_real_weights_assigned():
    with torch.device("meta"):
        weightless = TiedHead()
    ep = pf.export(weightless, (_ids(),))
    torch.manual_seed(0)
    real, ids = TiedHead(), _ids()
    program = ep.module()
    program.load_state_dict(real.state_dict(), assign=True)
    torch.testing.assert_close(program(ids), real(ids))
    program(ids).sum().backward()
    real(ids).sum().backward()
    torch.testing.assert_close(program.emb.weight.grad, real.emb.weight.grad)


def test_plain_torch_export_load_gives_every_name():
    """Regression: torch's module() registers only the signature's names, so a program loaded
    with plain ``torch.export.load`` lacked ``head.weight`` and ``other.scale``, and
    ``load_state_dict(model.state_dict())`` failed on the unexpected keys."""
    model, ids = TiedHead(), _ids()
    buffer = io.BytesIO()
    torch.export.save(export_checked(model, (ids,)), buffer)
    buffer.seek(0)
    program = torch.export.load(buffer).module()
    assert sorted(program.state_dict()) == sorted(model.state_dict())
    with torch.no_grad():
        model.emb.weight.mul_(-3)
        model.norm.scale.fill_(2.0)
    program.load_state_dict(model.state_dict())  # strict: every key on both sides
    torch.testing.assert_close(program(ids), model(ids))


def test_aliases_survive_save_load_unflatten_and_run_decompositions():
    model, ids = TiedHead(), _ids()
    ep = export_checked(model, (ids,))
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    loaded = pf.load(buffer)
    program = loaded.module()
    assert sorted(program.state_dict()) == sorted(model.state_dict())
    assert program.head.weight is program.emb.weight  # the serializer keeps one storage
    torch.testing.assert_close(program(ids), model(ids))
    unflat = torch.export.unflatten(ep)
    assert sorted(unflat.state_dict()) == sorted(model.state_dict())
    torch.testing.assert_close(unflat(ids), model(ids))
    decomposed = ep.run_decompositions()
    assert sorted(decomposed.state_dict) == sorted(model.state_dict())
    torch.testing.assert_close(decomposed.module()(ids), model(ids))


class SharedSubmoduleWithNonPersistentBuffer(torch.nn.Module):
    """One submodule under two names, holding a buffer that no state dict lists."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Module()
        self.a.register_buffer("buf", torch.arange(3.0), persistent=False)
        self.b = self.a

    def forward(self, x):
        return x + self.a.buf + self.b.buf


def test_shared_submodule_with_a_non_persistent_buffer():
    """Regression (PyTorch's test_duplicate_modules_with_non_persistent_buffers): module() raised
    "attribute 'buf' already exists" where torch's unlift had set the alias as a plain attribute."""
    model, x = SharedSubmoduleWithNonPersistentBuffer(), torch.randn(3)
    ep = export_checked(model, (x,))
    program = ep.module()
    assert [n for n, _ in program.named_buffers(remove_duplicate=False)] == ["a.buf", "b.buf"]
    torch.testing.assert_close(program(x), model(x))
