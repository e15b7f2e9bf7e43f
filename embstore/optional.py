"""Optional dependencies: imported when a feature needs them, with one clear error if absent.

``require("torch", extra="torch", feature="reading PyTorch files")`` returns the module or
raises :class:`~embstore.errors.MissingDependencyError` saying which extra installs it,
never a bare ``ModuleNotFoundError`` traceback.

:func:`lazy_attributes` makes a package's names and modules load on first use (PEP 562).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from .errors import MissingDependencyError

__all__ = ["require", "lazy_attributes"]


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


def lazy_attributes(package: str, names: Mapping[str, str], public: Iterable[str] = ()
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package ``package`` (PEP 562): each name of
    ``names`` imported from its module (``{name: ".module"}``, relative to the package) the
    first time it is asked for, then kept in the package; any other name that is a module
    of the package (``embstore.search.stream``) imported on use; ``__dir__`` lists the
    ``public`` names too."""
    module = sys.modules[package]
    public = tuple(public)

    def getattr_(name: str) -> Any:
        where = names.get(name)
        if where is None:
            if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            return importlib.import_module(f".{name}", package)
        value = getattr(importlib.import_module(where, package), name)
        setattr(module, name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(module)) | set(public))

    return getattr_, dir_

