"""Optional dependencies: imported when a feature needs them, with one clear error if absent.

``require("torch", extra="torch", feature="reading PyTorch files")`` returns the module or
raises :class:`~embstore.errors.MissingDependencyError` saying which extra installs it,
never a bare ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

__all__ = ["require"]


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """The imported ``module``; :class:`MissingDependencyError` if it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        missing = getattr(exc, "name", None) or top
        what = top if missing.split(".")[0] == top else f"{top} (missing: {missing})"
        raise MissingDependencyError(
            f"{feature} needs {what}, which is not installed: pip install 'embstore[{extra}]'",
            module=top, extra=extra) from None
