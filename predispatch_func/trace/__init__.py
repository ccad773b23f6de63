"""The mode stack used for tracing (see :mod:`.stack`) and the composite policy."""

from .composite_policy import CompositePolicy
from .stack import PolicyFunctionalMode, trace_functional

__all__ = ["CompositePolicy", "PolicyFunctionalMode", "trace_functional"]
