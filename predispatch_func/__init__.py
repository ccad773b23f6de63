"""predispatch_func: export PyTorch models into a functional pre-dispatch IR.

See ``export`` (the entry point), ``aot_export_module`` (the layer under it)
and ``verify`` (contract checks and replay against the reference).
"""

from .artifacts import AotSignature
from .errors import ExportError, Refusal, UnsupportedError, VerificationError
from .export import export, functionalize
from .inputs.input_check import InputError
from .joint import JointError, JointExportedProgram, JointProblem, export_joint, verify_joint
from .joint.aot import aot_export_module
from .opsets import OpSet
from .program.runtime import FunctionalExportedProgram, load
from .verify import VerifyReport, check_contract, replay_against_eager, replay_against_reference, verify

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


def __getattr__(name: str):
    """``pf.eager`` and ``pf.distributed`` load on first use: exporting never needs them, and a
    first export in a fresh process (the CLI, a conversion script) should not pay for importing them."""
    if name in ("eager", "distributed"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
