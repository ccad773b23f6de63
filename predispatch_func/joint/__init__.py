"""Training graphs: one functional program for forward, loss, backward (and optimizer step).

``export_joint`` (export.py) is the driver; docs/joint.md says what the program holds and
what its ``module()`` returns. Stages, one module each: loss.py (the step's forward),
differentiate.py (the joint trace), saved_values.py (what the backward reads),
signature.py, program.py (the program and its one-step module), verify.py.
"""

from .errors import JointError, JointProblem
from .export import differentiate_program, export_joint
from .program import JointExportedProgram
from .verify import verify_joint

__all__ = ["JointError", "JointExportedProgram", "JointProblem", "differentiate_program", "export_joint", "verify_joint"]
