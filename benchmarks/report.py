"""Markdown rendering of a benchmark run (the table the README includes)."""

from __future__ import annotations

from .common import fmt

_MET = {True: "yes", False: "**no**", None: "-"}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def summary_table(scenarios: list[dict]) -> list[str]:
    lines = ["| Scenario | embstore | peer | ratio | target | met? |", "|---|---|---|---|---|---|"]
    for s in scenarios:
        for c in s["comparisons"]:
            lines.append("| " + " | ".join(_cell(x) for x in (
                c["label"], c["embstore"], c["peer"] or "-", c["ratio_text"] or "-",
                c["target"] or "-", _MET[c["met"]])) + " |")
    return lines


def _params(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items())


def detail_tables(scenarios: list[dict]) -> list[str]:
    out: list[str] = []
    for s in scenarios:
        out += ["", f"### {s['name']}: {s['title']} ({s['status']}, {s['seconds']:.0f} s)", ""]
        if s["params"]:
            out.append(f"Parameters: {_params(s['params'])}.")
            out.append("")
        for n in s["notes"]:
            out.append(f"- {n}")
        if s["notes"]:
            out.append("")
        if not s["measurements"]:
            continue
        out += ["| case | method | median | min - max | n |", "|---|---|---|---|---|"]
        for m in s["measurements"]:
            extra = ""
            if m["extra"]:
                extra = " (" + ", ".join(f"{k} {v}" for k, v in m["extra"].items()) + ")"
            out.append(f"| {_cell(m['case'])} | {_cell(m['method'] + extra)} | "
                       f"{fmt(m['median'], m['unit'])} | {fmt(m['min'], m['unit'])} - "
                       f"{fmt(m['max'], m['unit'])} | {m['reps']} |")
    return out


def machine_line(run: dict) -> str:
    m, v = run["machine"], run["versions"]
    vers = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    return (f"{m['cpu_count']} cores ({m['cpu_model']}), {m['memory_gb']:.1f} GB RAM, "
            f"{m['platform']}; {vers}")


def render(run: dict) -> str:
    lines = [f"# embstore benchmarks, {run['date']} ({run['mode']} run)", "",
             f"Reproduce: `{run['command']}` (from the repository root).", "",
             f"Machine: {machine_line(run)}; embstore at commit {run['commit']}.", "",
             "Medians of interleaved repetitions (every repetition runs each method once, in "
             "rotating order), page cache warmed right before timing; ratios are embstore / "
             "peer for times (lower is better) and for rates (higher is better) unless they "
             "say \"faster\". Every method's result is checked against NumPy before it counts.",
             ""]
    if run["mode"] != "full":
        lines += [f"**{run['mode'].capitalize()} run: smaller tables and fewer repetitions than "
                  "the targets are set for; the figures check that the benchmarks work, the full "
                  "run (`python benchmarks/run.py`) measures.**", ""]
    sizes = [f"{s['name']}: {_params(s['params'])}" for s in run["scenarios"] if s["params"]]
    lines += summary_table(run["scenarios"])
    lines += ["", "Sizes: " + "; ".join(sizes) + "." if sizes else ""]
    skipped = [f"{s['name']}: {n}" for s in run["scenarios"] for n in s["notes"]
               if "skipped" in n or "ERROR" in n]
    if skipped:
        lines += ["", "Skipped or failed:"] + [f"- {_cell(x)}" for x in skipped]
    lines += ["", "## All measurements"] + detail_tables(run["scenarios"]) + [""]
    return "\n".join(lines)
