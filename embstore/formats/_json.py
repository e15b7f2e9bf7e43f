"""JSON read from an input file, parsed in one place.

``json.loads`` recurses once per nesting level: a document nested 100,000 deep (a
``config.json``, ``tokenizer.json``, ``*.index.json`` or safetensors header) raised
``RecursionError``, a traceback instead of one line.  Here every failure to parse is a
:class:`~embstore.errors.FormatError` naming the file.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import FormatError

__all__ = ["parse_json"]


def parse_json(raw: bytes, path: str, what: str = "JSON") -> Any:
    """The JSON document ``raw`` (UTF-8) of the file ``path``; :class:`FormatError` if it
    is not JSON, not UTF-8, or nested deeper than Python's recursion limit."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise FormatError(f"expected {what}, got a document nested too deep to parse (more "
                          "than ~1,000 levels of arrays and objects)", path=path) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"expected {what}, got unreadable text ({exc})", path=path) from None
