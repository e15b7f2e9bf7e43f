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


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(config, items) -> None:
    """Kills at a sample of a commit's steps are a subset of the kills at every step (the
    same table, the same change): where the ``-all`` twin runs (the slow tests selected),
    the ``-sample`` one is left out, so a full run does not kill at those steps twice."""
    ids = {item.nodeid for item in items}
    twins = [item for item in items if item.nodeid.endswith("-sample]")
             and item.nodeid[: -len("-sample]")] + "-all]" in ids]
    if twins:
        config.hook.pytest_deselected(items=twins)
        items[:] = [item for item in items if item not in twins]


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Scratch:
    return Scratch(tmp_path_factory.mktemp("reliability"))