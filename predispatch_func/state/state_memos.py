"""Caches of the model's own state filled in ``forward``, recognised from the trace.

timm's and transformers' LeViT, EfficientFormer and TinyViT keep
``self.attention_bias_cache = {}`` and fill it on the first eval call with a
tensor gathered from a parameter. Eager's later calls read that entry, which
equals what the program recomputes from the same parameter on every call, so
the program carries the cache. The Python-state judge (:mod:`.python_state`)
reaches that verdict by running the model four times in eager, a third of such
a model's export; the trace proves it without running anything when every new
entry of the dictionary

* is a tensor the trace made, not written in place since it was stored (an
  entry updated on every call would drift);
* was computed only from parameters, buffers and constants the program never
  writes, with no user input (shapes included), no random op and no
  higher-order op among what it was computed from;
* sits under a plain Python key (the same key on the next call: a hit).

The entries are read inside the trace (:func:`new_entries`, where
functionalization can still bring a stored tensor up to date) and judged
after it, on the graph (:func:`computed_from_unwritten_state`). Any other change
goes to the judge as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .. import _torch_compat as tc

_PLAIN_KEYS = (str, int, bool, type(None))


def new_entries(before: dict, now: dict) -> list[torch.fx.Node] | None:
    """The graph nodes of the entries ``now`` has and ``before`` had not; None when the
    change is anything else (an entry replaced or removed, a key or value that is not
    a plain key and a tensor of the trace). Call inside the trace."""
    if any(k not in now or now[k] is not v for k, v in before.items()):
        return None
    nodes = []
    for key, value in now.items():
        if key in before:
            continue
        if not _plain_key(key) or not isinstance(value, tc.FunctionalTensor) or tc.has_data_mutation(value):
            return None
        node = tc.proxy_node_of(tc.inner_of_functional(value))
        if node is None:
            return None
        nodes.append(node)
    return nodes


def _plain_key(key: Any) -> bool:
    if isinstance(key, tuple):
        return all(_plain_key(k) for k in key)
    return isinstance(key, _PLAIN_KEYS)


def computed_from_unwritten_state(nodes: Iterable[torch.fx.Node], readable: frozenset[torch.fx.Node]) -> bool:
    """Whether every node in ``nodes`` is computed from ``readable`` placeholders (the
    state the program never writes) and constants only, by ops that draw no random
    numbers and are no higher-order op."""
    seen: set[torch.fx.Node] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder":
            if node not in readable:
                return False
            continue
        if node.op == "call_function":
            target = node.target
            if isinstance(target, tc.HigherOrderOperator):
                return False
            if isinstance(target, tc.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags:
                return False
        elif node.op != "get_attr":  # a constant the trace made
            return False
        todo.extend(node.all_input_nodes)
    return True
