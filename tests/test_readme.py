"""The README's and the user guides' (docs/*.md) Python snippets run, and run twice in a row
(as a newcomer would); their links stay inside the repository and resolve."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDES = [README] + sorted((ROOT / "docs").glob("*.md"))
SNIPPETS = [(page, code) for page in GUIDES
            for code in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)]


#: snippets that train (100 steps over a 100,000-row table, twice: 11 CPU-s of the fast
#: subset, 2026-12-02) run with the slow tests
_TRAINS = "et.Embedding("


@pytest.mark.parametrize("page,code", [
    pytest.param(p, c, marks=[pytest.mark.slow] if _TRAINS in c else [],
                 id=f"{p.name}-{i}") for i, (p, c) in enumerate(SNIPPETS)])
def test_snippet_runs_twice(page, code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(compile(textwrap.dedent(code), str(page), "exec"),  # noqa: S102
             {"__name__": "__readme__"})
    assert os.listdir(tmp_path)  # the snippets write files where they run


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_links_stay_inside_the_repository(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith(("http://", "https://", "#")):
            continue
        target = target.split("#")[0]
        assert (page.parent / target).resolve().is_relative_to(ROOT), target
        assert (page.parent / target).exists(), target
    assert "../shared" not in text and not re.search(r"\bissue \d+", text)


def test_the_readme_is_a_short_guide():
    """At most ~200 lines: what it is, the two commands, the quick start, the command line,
    links; the rest lives in docs/."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def _readme_test_command() -> str:
    lines = [ln for ln in README.read_text(encoding="utf-8").splitlines()
             if ln.startswith("python3.11 -m venv") and "pytest" in ln]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_readme_test_command_is_what_ci_runs_and_cpu_only():
    """.ci/run runs the README's test command (with --quiet), timed; torch comes from
    PyTorch's CPU index before the extras, so no CUDA build is downloaded."""
    readme = _readme_test_command().split(" && ", 2)[2]  # after the venv and its activation
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    timed = re.findall(r"^time \((.*)\)$", ci, re.M)
    assert len(timed) == 1 and timed[0].replace(" --quiet", "") == readme
    cpu = "pip install --retries 1 torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    for text in (readme, timed[0].replace(" --quiet", "")):
        assert text.startswith(cpu + " && ") and text.index(cpu) < text.index(".[test]")
    assert "TIMEFORMAT=" in ci  # the elapsed time closes the log, beside pytest's summary


def test_the_readme_states_the_test_time_it_measured():
    """The figure next to the test command: the whole suite's count, wall time, cores and
    date, and the fast subset's; the lead re-measures it on the commit that changes it."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    whole = re.search(r"the whole suite, ([\d,]+) tests, took (\d+) min (\d+) s on 2 cores "
                      r"on (\d{4}-\d\d-\d\d)", text)
    fast = re.search(r"the fast subset, `-m \"not slow\"`, ([\d,]+) tests, (\d+) min (\d+) s",
                     text)
    assert whole and fast, "the README's test time is not stated in the checked form"
    assert int(fast.group(1).replace(",", "")) < int(whole.group(1).replace(",", ""))
