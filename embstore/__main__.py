"""``python -m embstore``: the same command line as ``embstore``."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
