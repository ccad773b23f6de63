"""Subcommands of ``predispatch-func`` that live in their own modules, each exposing ``register(subparsers)``."""
