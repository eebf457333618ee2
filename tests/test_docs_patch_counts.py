"""The patch count the README and docs/patches.md state for the pinned vLLM release equals
its series (a patch added or dropped without the docs following fails here)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}


def pinned_version() -> str:
    m = re.search(r"^VLLM\s*\?=\s*(\S+)\s*$", (ROOT / "Makefile").read_text(), re.M)
    assert m, "Makefile: no `VLLM ?= <version>` line"
    return m.group(1)


def series_count(version: str) -> int:
    lines = (ROOT / "patches" / f"vllm-{version}" / "series").read_text().splitlines()
    return sum(1 for ln in lines if ln.strip() and not ln.lstrip().startswith("#"))


def stated_counts(readme: str, patches_md: str, version: str) -> list[tuple[str, int]]:
    found = [("README status table", int(m.group(1))) for m in re.finditer(
        rf"\| patch sets \(pin vLLM {re.escape(version)}[^|]*\| (\d+) patches \+ overlay", readme)]
    found += [("README summary", int(m.group(1))) for m in re.finditer(
        rf"Patch set for vLLM {re.escape(version)}: (\d+) patches \+ overlay", readme)]
    found += [("docs/patches.md", WORDS[m.group(1)]) for m in re.finditer(
        rf"`patches/vllm-{re.escape(version)}/series` lists (\w+) patches", patches_md)]
    return found


def test_docs_state_the_pinned_series_count() -> None:
    version = pinned_version()
    want = series_count(version)
    found = stated_counts((ROOT / "README.md").read_text(),
                          (ROOT / "docs" / "patches.md").read_text(), version)
    assert len(found) == 3, f"expected three statements of the patch count, found {found}"
    assert all(n == want for _, n in found), f"series has {want} patches; docs say {found}"


def test_a_stale_count_is_caught() -> None:
    version = pinned_version()
    stale = stated_counts(f"| patch sets (pin vLLM {version}; x) | 3 patches + overlay |",
                          f"`patches/vllm-{version}/series` lists eleven patches.", version)
    assert stale == [("README status table", 3), ("docs/patches.md", 11)]
