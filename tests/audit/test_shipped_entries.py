"""The shipped table read line by line on demand: every entry is the one the whole-file
parse gives, a table in another layout is parsed whole, and an export that reads it
decides as one that parsed the whole table."""

import json

import pytest
import torch

from predispatch_func import schema_audit
from predispatch_func.artifacts import program_facts
from predispatch_func.schema_audit import table as audit_table
from predispatch_func.schema_audit.lazy import AtenEntries
from predispatch_func.torch_support import SUPPORTED_TORCH_RELEASES
from tests.support.reference import export_checked


@pytest.mark.parametrize("release", SUPPORTED_TORCH_RELEASES)
def test_every_entry_is_the_whole_files(release):
    path = audit_table.table_path(release)
    whole = audit_table.load(path).entries
    lazily = audit_table.ShippedEntries.read(path)
    assert len(lazily) == len(whole) and list(lazily) == list(whole)
    assert all(lazily[name] == entry for name, entry in whole.items())
    assert lazily.get("aten.no_such_op.default") is None


def test_a_table_in_another_layout_is_parsed_whole(tmp_path):
    whole = audit_table.load()
    one_line = tmp_path / "one-line.json"
    one_line.write_text(json.dumps(whole.to_json()))
    lazily = audit_table.ShippedEntries.read(one_line)
    assert dict(lazily) == whole.entries


def test_a_table_of_another_format_is_refused(tmp_path):
    text = audit_table.table_path().read_text().replace('"format": 1', '"format": 99', 1)
    with pytest.raises(ValueError, match="format 99"):
        audit_table.ShippedEntries(text)


def test_an_entry_under_another_name_is_not_trusted():
    lines = audit_table.table_path().read_text().split("\n")
    name = json.loads(lines[1].removesuffix(","))["op"]
    renamed = lines[1].replace(f'"op": "{name}"', f'"op": "{name}_renamed"', 1)
    entries = audit_table.ShippedEntries("\n".join([lines[0], renamed, *lines[2:]]))
    with pytest.raises(KeyError):
        entries[name]  # the line now names another op: found under that name only
    assert entries[f"{name}_renamed"].op == f"{name}_renamed"


def test_a_table_out_of_order_never_gives_another_ops_entry():
    lines = audit_table.table_path().read_text().rstrip("\n").split("\n")
    body = [line.removesuffix(",") for line in lines[1:-1]]
    shuffled = [lines[0], ",\n".join(reversed(body)), lines[-1]]
    entries = audit_table.ShippedEntries("\n".join(shuffled))
    names = [json.loads(line)["op"] for line in body]
    found = {name: entries.get(name) for name in names[:: max(1, len(names) // 40)]}
    assert all(entry is None or entry.op == name for name, entry in found.items())


def test_a_line_that_is_not_an_entry_is_refused():
    lines = audit_table.table_path().read_text().split("\n")
    entries = audit_table.ShippedEntries("\n".join([lines[0], '"not an entry",', *lines[2:]]))
    with pytest.raises(ValueError, match="not an entry"):
        entries[json.loads(lines[1].removesuffix(","))["op"]]


class TypeAsLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, y):
        return torch.nn.functional.layer_norm(self.lin(x.type_as(y)), (3,))


def test_an_export_decides_as_with_the_whole_table():
    args = (torch.randn(2, 3), torch.randn(2, 3))
    try:
        schema_audit.use_aten_entries(AtenEntries(audit_table.load().entries, lazy=False))
        whole = program_facts(export_checked(TypeAsLinear(), args).graph_module).composite_decisions
        schema_audit.use_aten_entries(None)  # the installed torch's, read line by line
        lazily = program_facts(export_checked(TypeAsLinear(), args).graph_module).composite_decisions
    finally:
        schema_audit.use_aten_entries(None)
    assert isinstance(schema_audit._aten_entries()._entries, audit_table.ShippedEntries)
    assert lazily == whole and whole["aten.type_as.default"] == ("decompose", "schema audit")
