"""The README's Python snippets run, and run twice in a row (as a newcomer would)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_readme_snippet_runs_twice(code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})  # noqa: S102
    assert os.listdir(tmp_path)  # the snippets write files where they run


def test_readme_links_stay_inside_the_repository():
    text = README.read_text(encoding="utf-8")
    root = README.parent
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith(("http://", "https://", "#")):
            continue
        assert (root / target).resolve().is_relative_to(root), target
        assert (root / target).exists(), target
    assert "../shared" not in text and not re.search(r"\bissue \d+", text)
