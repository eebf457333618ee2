"""Render a drift report (the dict of :func:`deepinfer.drift.build_report`) for people:
a rich table on the terminal and the same content as markdown."""
from __future__ import annotations

import re

from rich.table import Table

from .console import console

STYLE = {"clean": "green", "offset": "green", "ok": "green", "fuzz": "yellow",
         "three-way": "yellow", "upstream-changed": "yellow", "merged-upstream": "cyan",
         "already-applied": "cyan", "conflict": "bold red", "file-missing": "bold red",
         "collision": "bold red", "upstream-missing": "bold red", "vanished-symbol": "bold red"}


def _hunk_note(h: dict) -> str:
    parts = []
    if h["status"] in ("offset", "fuzz", "already-applied") and h["offset"]:
        parts.append(f"offset {h['offset']:+d}")
    if h["fuzz"]:
        parts.append(f"fuzz {h['fuzz']}")
    if h["target_line"]:
        parts.append(f"at line {h['target_line']}")
    if h["status"] not in ("clean", "offset") and h["detail"]:
        parts.append(h["detail"])
    return "; ".join(parts)


def rows(report: dict):
    """(patch, file, hunk, status, note) rows in series order."""
    for p in report["patches"]:
        for f in p["files"]:
            path = f["path"] + (f" -> {f['renamed_to']}" if f["renamed_to"] else "")
            for h in f["hunks"] or [{"index": 0, "header": "", "status": f["status"],
                                     "offset": 0, "fuzz": 0, "target_line": None,
                                     "detail": f["detail"], "upstream_now": []}]:
                yield p["name"], path, f"#{h['index']} {h['header']}", h["status"], _hunk_note(h), h


def _title(report: dict) -> str:
    t = report["to"]
    return (f"vLLM {report['from']['version']} patch set against {t['label']} "
            f"({t['source']}{', commit ' + t['commit'] if t['commit'] else ''})")


def print_report(report: dict) -> None:
    console.print(f"[bold]drift:[/] {_title(report)}", soft_wrap=True)
    n = len(report["patches"])
    conflicts = []
    for p in report["patches"]:
        st = p["status"]
        console.print(f"[bold][{p['index']}/{n}] {p['name']}[/]  [{STYLE.get(st, '')}]{st}[/]",
                      soft_wrap=True)
        for f in p["files"]:
            path = f["path"] + (f" -> {f['renamed_to']}" if f["renamed_to"] else "")
            console.print(f"  {path}", markup=False, soft_wrap=True)
            for name, _path, hunk, status, note, h in rows({"patches": [{**p, "files": [f]}]}):
                m = re.match(r"#(\d+) @@ (-\S+)", hunk)
                short = f"#{m.group(1)} {m.group(2)}" if m else hunk.split(" ")[0]
                console.print(f"    {short:<13} [{STYLE.get(status, '')}]{status:<16}[/] {note}",
                              soft_wrap=True)
                if h.get("upstream_now"):
                    conflicts.append((name, f["path"], hunk, h))
    for name, path, hunk, h in conflicts:
        where = f" at line {h['target_line']}" if h["target_line"] else ""
        console.print(f"[bold red]{h['status']}[/]: patch {name}, hunk {hunk}, file {path}: "
                      f"upstream {report['to']['label']} has{where}:", soft_wrap=True)
        for line in h["upstream_now"]:
            console.print("    " + line, markup=False, soft_wrap=True)
    ot = Table(title="overlay files that need attention")
    for col in ("file", "kind", "status", "findings"):
        ot.add_column(col, overflow="fold")
    flagged = [o for o in report["overlay"] if o["status"] != "ok" or o["findings"]]
    for o in flagged:
        notes = "; ".join(f["detail"] for f in o["findings"])
        ot.add_row(o["path"], o["kind"], f"[{STYLE.get(o['status'], '')}]{o['status']}[/]", notes)
    if flagged:
        console.print(ot)
    for o in flagged:
        if o["upstream_diff"]:
            console.print(f"upstream change to {o['path']} (port it into {o['source']}):",
                          soft_wrap=True)
            console.print(o["upstream_diff"].rstrip("\n"), markup=False, soft_wrap=True)
    ok = len(report["overlay"]) - len(flagged)
    console.print(f"overlay: {ok} of {len(report['overlay'])} files ok "
                  "(full list in the markdown/JSON report)", soft_wrap=True)
    s = report["summary"]
    console.print("patches: " + ", ".join(f"{k} {v}" for k, v in sorted(s["patches"].items()))
                  + " | hunks: " + ", ".join(f"{k} {v}" for k, v in sorted(s["hunks"].items()))
                  + " | overlay: " + (", ".join(f"{k} {v}" for k, v in
                                                sorted(s["overlay"].items())) or "none"),
                  soft_wrap=True)


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(report: dict) -> str:
    out = [f"# Drift: {_title(report)}", "",
           f"Schema `{report['schema']}`; overlay manifest: {report['overlay_manifest']}.", ""]
    s = report["summary"]
    out += ["| | " + " | ".join(["counts"]) + " |", "|---|---|"]
    for k in ("patches", "hunks", "overlay"):
        out.append(f"| {k} | " + (", ".join(f"{a} {b}" for a, b in sorted(s[k].items())) or "-")
                   + " |")
    out += ["", "## Patches", "", "| patch | file | hunk | status | note |", "|---|---|---|---|---|"]
    details = []
    for name, path, hunk, status, note, h in rows(report):
        out.append(f"| {_md(name)} | `{_md(path)}` | `{_md(hunk)}` | **{status}** | {_md(note)} |")
        if h.get("upstream_now"):
            details += [f"### {name}: {path} hunk {hunk}", "",
                        f"Upstream {report['to']['label']} has there now"
                        + (f" (line {h['target_line']})" if h["target_line"] else "") + ":", "",
                        "```", *h["upstream_now"], "```", ""]
    if details:
        out += ["", "## What upstream has where hunks fail", "", *details]
    out += ["", "## Overlay", ""]
    if report["overlay"]:
        out += ["| file | kind | status | findings |", "|---|---|---|---|"]
        for o in report["overlay"]:
            notes = "; ".join(f["detail"] for f in o["findings"]) or "-"
            out.append(f"| `{_md(o['path'])}` | {o['kind']} | **{o['status']}** | {_md(notes)} |")
        for o in report["overlay"]:
            if o["upstream_diff"]:
                out += ["", f"### Upstream change to `{o['path']}`", "", "```diff",
                        o["upstream_diff"].rstrip("\n"), "```"]
    else:
        out.append("No overlay files.")
    return "\n".join(out) + "\n"
