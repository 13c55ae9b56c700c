"""Errors shared by the stages (a neutral module: codegen and runtime both raise
them, and neither imports the other)."""

from __future__ import annotations


class CompileError(RuntimeError):
    """No artifact could be built: no compiler, a plan a backend cannot generate,
    a rejected source (a disc_tf bug) or a compile that ran past its timeout."""


class CodegenError(CompileError):
    """A backend cannot generate code for a plan (an unsupported kernel kind, op or
    element type); the optimizer leaves the cluster as TF ops."""
