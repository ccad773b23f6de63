"""Custom composites for the schema-audit tests (namespace ``auditdemo``).

Imported once per process (by the tests and by ``predispatch-func audit
--import tests.support.custom_ops_for_audit --namespace auditdemo``).
"""

import torch

_lib = torch.library.Library("auditdemo", "DEF")  # noqa: TOR901 (kept alive for the process)

_lib.define("returns_input(Tensor x) -> Tensor")
_lib.impl("returns_input", lambda x: x, "CompositeImplicitAutograd")


def _bumps_input(x):
    x.add_(1)  # writes x, although the schema has no (a!)
    return x * 2


_lib.define("bumps_input(Tensor x) -> Tensor")
_lib.impl("bumps_input", _bumps_input, "CompositeImplicitAutograd")

_lib.define("honest_double(Tensor x) -> Tensor")
_lib.impl("honest_double", lambda x: x * 2, "CompositeImplicitAutograd")

_lib.define("crashes(Tensor x) -> Tensor")


def _crashes(x):
    import ctypes

    ctypes.string_at(0)  # a segfault, like some aten kernels on odd inputs
    return x


_lib.impl("crashes", _crashes, "CompositeImplicitAutograd")

_lib.define("aliases_the_other(Tensor(a) x, Tensor y) -> Tensor(a)")
_lib.impl("aliases_the_other", lambda x, y: y, "CompositeImplicitAutograd")  # declares x, returns y
