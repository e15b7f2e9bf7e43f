"""Fixtures and the closing summary of the reliability suite (helpers: relhelpers.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from relhelpers import TRIED, Scratch


def pytest_terminal_summary(terminalreporter) -> None:
    if not TRIED:
        return
    terminalreporter.section("reliability: malformed inputs and kill points tried")
    for name, n in sorted(TRIED.items()):
        terminalreporter.write_line(f"{name:40} {n}")
    out = os.environ.get("EMBSTORE_RELIABILITY_REPORT")
    if out:
        Path(out).write_text(json.dumps(dict(sorted(TRIED.items())), indent=2))


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Scratch:
    return Scratch(tmp_path_factory.mktemp("reliability"))