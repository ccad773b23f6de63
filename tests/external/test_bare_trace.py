"""scripts/bare_trace.py, the benchmarks' floor: it must trace the model's own computation
(replayed on the real state it equals eager) and leave the model as it was."""

import torch

from scripts.bare_trace import bare_trace


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x, *, scale=2.0):
        y = torch.relu(self.bn(self.conv(x)))
        with torch.no_grad():
            y = y * scale
        return self.fc(y.mean((2, 3))), y.sum()


def test_the_floor_replays_as_eager_and_leaves_the_model_untouched():
    torch.manual_seed(0)
    model, x = _Net().train(), torch.randn(2, 3, 8, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for metadata in (False, True):
        gm = bare_trace(model, (x,), {"scale": 3.0}, metadata=metadata)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        state = {k: v.clone() for k, v in [*model.named_parameters(), *model.named_buffers()]}
        got = gm(state, x)
        expected = model(x, scale=3.0)
        model.load_state_dict(before)
        assert len(got) == 2 and all(torch.allclose(g, e) for g, e in zip(got, expected))
        if metadata:
            assert any(n.meta.get("stack_trace") for n in gm.graph.nodes if n.op == "call_function")


class _Caching(torch.nn.Module):
    """Fills a cache in ``forward`` (as transformers' LeViT keeps its attention biases)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3))
        self.cache, self.seen = {}, []

    def forward(self, x):
        if "w" not in self.cache:
            self.cache["w"] = self.weight * 2
        self.seen.append(1)
        self.note = x.shape[0]
        return x * self.cache["w"]


def test_the_floor_leaves_a_cache_filled_in_forward_as_it_was():
    model = _Caching()
    bare_trace(model, (torch.randn(2, 3),))
    assert model.cache == {} and model.seen == [] and not hasattr(model, "note")
    model(torch.randn(2, 3))  # eager fills it with a real tensor afterwards
    assert type(model.cache["w"]) is torch.Tensor and type(model.cache["w"]).__name__ == "Tensor"
