"""predispatch_func: export PyTorch models into a functional pre-dispatch IR.

See ``export`` (the entry point), ``aot_export_module`` (the layer under it)
and ``verify`` (contract checks and replay against the reference).
"""

from typing import TYPE_CHECKING

from .artifacts import AotSignature
from .errors import ExportError, Refusal, UnsupportedError, VerificationError
from .export import export, functionalize
from .inputs.input_check import InputError
from .opsets import OpSet
from .program.runtime import FunctionalExportedProgram, load
from .verify import VerifyReport, check_contract, replay_against_eager, replay_against_reference, verify

if TYPE_CHECKING:  # loaded on first use (__getattr__ below)
    from . import distributed, eager
    from .joint import JointError, JointExportedProgram, JointProblem, export_joint, verify_joint
    from .joint.aot import aot_export_module

__all__ = [
    "AotSignature",
    "ExportError",
    "InputError",
    "Refusal",
    "UnsupportedError",
    "VerificationError",
    "VerifyReport",
    "aot_export_module",
    "check_contract",
    "distributed",
    "eager",
    "FunctionalExportedProgram",
    "export",
    "export_joint",
    "JointError",
    "JointExportedProgram",
    "JointProblem",
    "load",
    "OpSet",
    "functionalize",
    "replay_against_eager",  # the old name of replay_against_reference
    "replay_against_reference",
    "verify",
    "verify_joint",
]


# where each name that loads on first use lives
_LAZY = {"eager": None, "distributed": None, "JointError": "joint", "JointExportedProgram": "joint",
         "JointProblem": "joint", "export_joint": "joint", "verify_joint": "joint", "aot_export_module": "joint.aot"}


def __getattr__(name: str):
    """``pf.eager``, ``pf.distributed`` and the training-graph API (``joint/``) load on first use:
    ``pf.export`` never needs them, and a first export in a fresh process (the CLI, a conversion
    script) should not pay for importing them."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"{__name__}.{_LAZY[name] or name}")
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value
