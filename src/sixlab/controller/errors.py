"""The root of every error ``sixlab.controller`` raises (the tree is in the package docstring)."""

from __future__ import annotations

__all__ = ["ControllerError"]


class ControllerError(ValueError):
    """A request the controller refuses; the message names the field."""
