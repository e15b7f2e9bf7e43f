"""Library messages in the command line's terms: ``overwrite=True`` becomes ``--overwrite``.

A module of its own (it imports only ``re``) so that the command group shows errors without
loading any command.
"""

from __future__ import annotations

import re

# The library names parameters (overwrite=True, oov='zero'); the CLI shows flags instead.
_FLAGS = ("overwrite tensor vocab vocab_out format resume keys oov unicode_errors scheduler "
          "encoding member column warm cache_bytes").split()
_PARAM_RE = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(True\b|'[^']*')?")


def flag_terms(message: str) -> str:
    """``message`` with ``name=True``, ``name='value'`` and ``name=`` as flags."""
    return _PARAM_RE.sub(lambda m: "--" + m[1].replace("_", "-") + (
        f" {m[2][1:-1]}" if m[2] and m[2] != "True" else ""), message)
