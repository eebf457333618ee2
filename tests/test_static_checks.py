"""pyflakes over every Python file of the project (flake8's F codes, which honour ``# noqa``).

Most of ``bench/`` and ``scripts/device/`` runs only on the GPU machine, where a misspelt
name costs a device call; this finds undefined names, unused imports and shadowed
definitions on the CPU. The patched vLLM files are checked in ``test_gates_sm80.py``
(messages the series adds to upstream's files).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("tools", "overlay", "bench", "tests", "scripts")


def test_project_python_has_no_pyflakes_messages() -> None:
    try:
        import flake8  # noqa: F401
    except ImportError as e:  # a declared test dependency: fail, do not skip
        raise AssertionError("flake8 missing: pip install -e '.[test]' (make test does)") from e
    dirs = [d for d in CHECKED if (ROOT / d).is_dir()]
    assert "bench" in dirs and "overlay" in dirs, dirs
    res = subprocess.run([sys.executable, "-m", "flake8", "--isolated", "--select=F", *dirs],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and not res.stdout.strip(), (
        "pyflakes messages (fix them, or mark an intended one `# noqa: F<code>`):\n"
        + res.stdout + res.stderr)


def test_the_check_reports_an_undefined_name(tmp_path) -> None:
    """The check above would see a broken script (the command, not only its exit code)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f():\n    return undefined_thing\n")
    res = subprocess.run([sys.executable, "-m", "flake8", "--isolated", "--select=F", str(bad)],
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert "F821 undefined name 'undefined_thing'" in res.stdout
    assert "F401 'os' imported but unused" in res.stdout


def test_device_scripts_parse() -> None:
    """`bash -n` over every shell script of scripts/device/ and .ci/: a syntax error there
    costs a device call (or a CI run) to find."""
    scripts = sorted((ROOT / "scripts" / "device").glob("*.sh")) + [ROOT / ".ci" / "run"]
    assert len(scripts) > 10, scripts
    bad = []
    for s in scripts:
        res = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True)
        if res.returncode != 0:
            bad.append(f"{s.relative_to(ROOT)}: {res.stderr.strip()}")
    assert not bad, "shell syntax errors:\n" + "\n".join(bad)


def test_the_shell_check_reports_a_syntax_error(tmp_path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("if true; then\n  echo unterminated\n")
    assert subprocess.run(["bash", "-n", str(bad)], capture_output=True).returncode != 0
