"""predispatch_func: export PyTorch models into a functional pre-dispatch IR.

See ``export`` (the entry point), ``aot_export_module`` (the layer under it)
and ``verify`` (contract checks and replay against eager).
"""

from .aot import AotSignature, aot_export_module
from .errors import ExportError, Refusal, UnsupportedError, VerificationError
from .program.input_check import InputError
from .opsets import OpSet
from .export import FunctionalExportedProgram, export, functionalize, load
from .verify import VerifyReport, check_contract, replay_against_eager, verify
from . import eager

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
    "eager",
    "FunctionalExportedProgram",
    "export",
    "load",
    "OpSet",
    "functionalize",
    "replay_against_eager",
    "verify",
]
