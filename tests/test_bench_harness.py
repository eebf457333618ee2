"""CPU checks of the benchmark harness (bench/common.py), the upstream importer
(bench/upstream_import.py) and the GPU bundle builder (tools/deepinfer/bundle.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _fake_info():
    return {"gpu": "Fake GPU", "sm_count": 7, "capability": "8.0", "memory_gib": 1.0,
            "l2_mib": 40.0, "torch": "t", "cuda_runtime": "c", "python": "p", "triton": "x"}


@pytest.fixture()
def common(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(BENCH))
    import common as c

    monkeypatch.setattr(c, "device_info", _fake_info)
    monkeypatch.setattr(c, "l2_bytes", lambda device=None: 60 * 2**20)
    return c


def test_environment_knobs_leave_out_the_vllm_c_build_cache(common, monkeypatch):
    """tests/vllm_c_ops.py's cache directory changes no benchmark; recording it wrote this
    machine's checkout path into the results."""
    monkeypatch.setenv("DEEPINFER_VLLM_C_DIR", "/home/someone/repo/build/vllm-c")
    monkeypatch.setenv("DEEPINFER_GATHER_EXP", "2")
    knobs = common.environment_knobs()
    assert "DEEPINFER_VLLM_C_DIR" not in knobs
    assert knobs["DEEPINFER_GATHER_EXP"] == "2"


def test_rotation_count(common):
    l2 = 60 * 2**20
    assert common.rotation_count(10 * 2**20) == 12  # 2 x L2 / 10 MiB
    assert common.rotation_count(200 * 2**20) == 2  # at least two sets
    assert common.rotation_count(1, max_sets=64) == 64
    assert common.rotation_count(l2 // 3 + 1) == 6


def test_report_json_and_markdown_section(common, tmp_path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("DEEPINFER_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("DEEPINFER_BENCH_COMMAND", "make bench")
    r = common.Report(name="demo", title="Demo run", columns=["kernel", "median_us", "ok"])
    r.meta["copy"] = {"gbps_read_plus_write": 4000.0, "method": "m"}
    r.add(kernel="k|1", median_us=12.345, ok=True)
    r.add(kernel="k2", median_us=None, ok=False)
    assert r.check("a check", False, "detail") is False
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\nintro\n\n<!-- BEGIN demo -->\nstale\n<!-- END demo -->\n\n"
                   "<!-- BEGIN other -->\nkeep me\n<!-- END other -->\n")
    r.write_markdown(doc)
    r.write_markdown(doc)  # idempotent: one section, replaced in place
    text = doc.read_text()
    assert text.count("<!-- BEGIN demo -->") == 1 and "stale" not in text
    assert "keep me" in text and text.index("intro") < text.index("Demo run")
    assert "| k\\|1 | 12.3 | yes |" in text and "| k2 | - | NO |" in text
    assert "Fake GPU (7 SMs" in text and "4000 GB/s" in text
    assert "make bench (runs: " in text and "FAIL: a check (detail)" in text
    path = r.write_json(tmp_path / "results")
    data = json.loads(path.read_text())
    assert path.name.startswith("demo_fake-gpu_") and data["rows"][0]["median_us"] == 12.345
    assert data["checks"] == [{"what": "a check", "ok": False, "detail": "detail"}]
    new = tmp_path / "new.md"  # a missing doc gets created with the section appended
    r.write_markdown(new)
    assert new.read_text().startswith("# Benchmarks") and "<!-- END demo -->" in new.read_text()
    assert data["meta"]["environment"] == {} and "Set for this run" not in text


def test_report_finish_writes_both_and_returns_the_exit_status(common, tmp_path, capsys):
    """``finish``: the JSON always, the markdown section unless ``write_doc`` is false (the
    scripts' --no-doc), the table printed; 1 when a check failed, 0 when all passed."""
    r = common.Report(name="fin", title="Finish", columns=["k"])
    r.add(k="a")
    r.check("fine", True)
    doc = tmp_path / "b.md"
    assert r.finish(False, results_dir=tmp_path / "res", doc=doc) == 0
    assert len(list((tmp_path / "res").glob("fin_*.json"))) == 1 and not doc.exists()
    assert "| a |" in capsys.readouterr().out
    r.check("broken", False)
    assert r.finish(True, results_dir=tmp_path / "res", doc=doc) == 1
    assert "<!-- BEGIN fin -->" in doc.read_text()


def test_report_records_knobs_of_the_run(common, monkeypatch):
    """A run under a kernel knob or another extension build says so (JSON and markdown)."""
    for k in [k for k in os.environ if k.startswith("DEEPINFER_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("DEEPINFER_BENCH_COMMAND", "make bench")
    monkeypatch.setenv("DEEPINFER_GATHER_EXP", "2")
    monkeypatch.setenv("DEEPINFER_SM80_EXT", "/tmp/ab-so/new.so")
    r = common.Report(name="demo", title="Demo run", columns=["kernel"])
    assert r.meta["environment"] == {"DEEPINFER_GATHER_EXP": "2",
                                     "DEEPINFER_SM80_EXT": "/tmp/ab-so/new.so"}
    assert ("- Set for this run (kernel knobs, extension): `DEEPINFER_GATHER_EXP=2`, "
            "`DEEPINFER_SM80_EXT=/tmp/ab-so/new.so`") in r.markdown()


def _fake_tree(root: Path) -> Path:
    """A vLLM-like tree whose package __init__ files must not run."""
    files = {
        "vllm/__init__.py": "raise RuntimeError('vllm/__init__ must not run')\n",
        "vllm/_version.py": "__version__ = version = '9.8.7'\n",
        "vllm/models/__init__.py": "raise RuntimeError('models/__init__ must not run')\n",
        "vllm/models/ops/__init__.py": "raise RuntimeError('ops/__init__ must not run')\n",
        "vllm/models/ops/kern.py": textwrap.dedent("""
            from importlib.metadata import version
            import vllm.util
            VERSION = version("vllm")
            """),
        "vllm/util.py": "import vllm._C_stable_libtorch\nX = 1\n",
        "vllm/needs_dep.py": "import surely_not_installed_pkg_xyz\n",
        "LICENSE": "license text\n",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _run_importer(tree: Path, module: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(BENCH)!r})
        import upstream_import as ui
        try:
            m = ui.import_upstream({module!r}, {str(tree)!r})
        except ui.UpstreamImportError as e:
            print("ERR", e)
            raise SystemExit(3)
        print("OK", m.VERSION, m.__file__)
        """)
    env = {k: v for k, v in os.environ.items() if k != "DEEPINFER_VLLM_TREE"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)


def test_upstream_import_uses_shells_metadata_and_empty_extension(tmp_path):
    tree = _fake_tree(tmp_path / "tree")
    p = _run_importer(tree, "vllm.models.ops.kern")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("OK 9.8.7 ") and str(tree) in p.stdout


def test_upstream_import_names_missing_package(tmp_path):
    tree = _fake_tree(tmp_path / "tree")
    p = _run_importer(tree, "vllm.needs_dep")
    assert p.returncode == 3
    assert "surely_not_installed_pkg_xyz" in p.stdout and "setup.sh" in p.stdout


def test_upstream_import_rejects_non_tree(tmp_path):
    p = _run_importer(tmp_path, "vllm.models.ops.kern")
    assert p.returncode == 3 and "no vLLM source tree found" in p.stdout


def test_gpu_bundle_contents(tmp_path, monkeypatch):
    pytest.importorskip("rich")
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    from deepinfer import bundle

    tree = _fake_tree(tmp_path / "tree")
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "pyzmq-27.0.0-cp312-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"not really a wheel")
    out = tmp_path / "b.tar.gz"
    m = bundle.build_bundle(tree, out, wheelhouse=wh)
    assert out.is_file() and m["size_bytes"] < bundle.SIZE_LIMIT
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        top = bundle.TOP
        for rel in ("Makefile", "mk/bench.mk", "mk/00-bundle.mk", "setup.sh", "BUNDLE.json", "README-bundle.md",
                    "bench/common.py", "bench/upstream_import.py", "tools/deepinfer/bundle.py",
                    "overlay/deepinfer_sm80/triton_portable/gather.py",
                    "vllm-tree/vllm/models/ops/kern.py", "vllm-tree/LICENSE",
                    "wheelhouse/MODULES", "wheelhouse/pyzmq-27.0.0-cp312-abi3-manylinux_2_28_x86_64.whl"):
            assert f"{top}/{rel}" in names, rel
        assert not any(n.endswith((".pyc", ".so")) or "__pycache__" in n for n in names)
        assert tar.getmember(f"{top}/setup.sh").mode & 0o111
        mods = tar.extractfile(f"{top}/wheelhouse/MODULES").read().decode()
        assert mods.strip() == "pyzmq-27.0.0-cp312-abi3-manylinux_2_28_x86_64.whl zmq"
        meta = json.loads(tar.extractfile(f"{top}/BUNDLE.json").read())
        assert meta["vllm_py_files"] == 7 and len(meta["wheels"]) == 1
        assert meta["vllm_version"] == "9.8.7 (?)"  # no commit id, no applied patch set


def test_gpu_bundle_names_the_tree_version_and_patch_set(tmp_path, monkeypatch):
    """BUNDLE.json says which vLLM and which patch set the bundle's tree holds (GPU logs
    print it), read from the tree's files as apply wrote them."""
    pytest.importorskip("rich")
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    from deepinfer import bundle
    from deepinfer.patchset import PIN_MODULE_TREE_PATH, load_patchset, pin_module_text

    tree = _fake_tree(tmp_path / "tree")
    (tree / "vllm/_version.py").write_text(
        "__version__: str\n__commit_id__: str | None\n__version__ = version = '0.34.0'\n"
        "__commit_id__ = commit_id = 'g62d4bc3c7'\n")
    (tree / PIN_MODULE_TREE_PATH).write_text(pin_module_text(load_patchset("0.33.0", ROOT).pin))
    assert bundle._tree_version(tree) == "0.34.0 (g62d4bc3c7), patch set vllm-0.33.0"


def test_gpu_bundle_refuses_non_tree_and_unknown_wheels(tmp_path, monkeypatch):
    pytest.importorskip("rich")
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    from deepinfer import bundle
    from deepinfer.console import DeepinferError

    wh = tmp_path / "wh"
    wh.mkdir()
    with pytest.raises(DeepinferError, match="not a vLLM source tree"):
        bundle.build_bundle(tmp_path, tmp_path / "x.tar.gz", wheelhouse=wh)
    (wh / "numpy-2.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    with pytest.raises(DeepinferError, match="unexpected wheel"):
        bundle.build_bundle(_fake_tree(tmp_path / "t"), tmp_path / "x.tar.gz", wheelhouse=wh)


def _tiny_wheel(folder: Path, dist: str, module: str, body: str) -> Path:
    """A minimal, installable pure-Python wheel providing ``module``."""
    import base64
    import hashlib
    import zipfile

    files = {f"{module}/__init__.py": body,
             f"{dist}-1.0.dist-info/METADATA": (f"Metadata-Version: 2.1\nName: {dist}\n"
                                                "Version: 1.0\n"),
             f"{dist}-1.0.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: test\n"
                                             "Root-Is-Purelib: true\nTag: py3-none-any\n")}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}-1.0.dist-info/RECORD,,")
    files[f"{dist}-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = folder / f"{dist}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_gpu_bundle_vllm_deps_reach_only_the_vllm_level_checks(tmp_path, monkeypatch):
    """`make gpu-bundle VLLM_DEPS=1`: the wheels go to wheelhouse-vllm/ and BUNDLE.json;
    setup.sh installs them into .site-vllm/ and its python wrapper names that folder in
    $DEEPINFER_VLLM_DEPS; the harness then finds a module there and puts the folder first on
    a vLLM-level check's PYTHONPATH (a folder holding a vllm/ package is left off), while the
    interpreter's own path does not see it."""
    pytest.importorskip("rich")
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    from deepinfer import bundle

    tree = _fake_tree(tmp_path / "tree")
    wh, whv = tmp_path / "wh", tmp_path / "whv"
    wh.mkdir()
    whv.mkdir()
    # zmq present here: setup.sh skips this wheel, which is not installable
    (wh / "pyzmq-27.0.0-cp312-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"not a wheel")
    _tiny_wheel(whv, "deepinfer_probe_dep", "deepinfer_probe_dep", "WHERE = 'site-vllm'\n")
    # a no-dependencies extra whose module this machine has (the CPU suite's venv has
    # xgrammar): setup.sh must leave it out
    (whv / "no-deps").mkdir()
    _tiny_wheel(whv / "no-deps", "xgrammar", "xgrammar", "raise ImportError('shadowed')\n")
    out = tmp_path / "b.tar.gz"
    m = bundle.build_bundle(tree, out, wheelhouse=wh, vllm_deps_wheelhouse=whv)
    assert sorted(m["vllm_deps_wheels"]) == ["deepinfer_probe_dep-1.0-py3-none-any.whl",
                                              "xgrammar-1.0-py3-none-any.whl"]
    with tarfile.open(out) as tar:
        tar.extractall(tmp_path / "u", filter="data")
    top = tmp_path / "u" / bundle.TOP
    assert (top / "wheelhouse-vllm" / "deepinfer_probe_dep-1.0-py3-none-any.whl").is_file()
    modules = (top / "wheelhouse-vllm/MODULES").read_text()
    assert modules == "xgrammar-1.0-py3-none-any.whl xgrammar\n"
    pytest.importorskip("zmq")
    pytest.importorskip("xgrammar")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEEPINFER_VLLM_DEPS")}
    r = subprocess.run(["bash", "setup.sh"], cwd=top, env=dict(env, PYTHON=sys.executable),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (top / ".site-vllm" / "deepinfer_probe_dep" / "__init__.py").is_file()
    assert not (top / ".site-vllm" / "xgrammar").exists()
    assert "xgrammar already importable, skipping xgrammar-1.0-py3-none-any.whl" in r.stdout
    code = textwrap.dedent(f"""
        import importlib.util, os, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        os.environ["PYTHONPATH"] = os.pathsep.join([{str(ROOT / "overlay")!r}, "/x"])
        import vllm_cpu_harness as h
        print(os.environ.get("DEEPINFER_VLLM_DEPS"))
        print(importlib.util.find_spec("deepinfer_probe_dep") is None)
        h.REQUIRED_MODULES = ("deepinfer_probe_dep",)
        print(h.missing_dependencies(), importlib.util.find_spec("deepinfer_probe_dep") is None)
        print(h.subprocess_pythonpath())
        """)
    r = subprocess.run([str(top / ".venv/bin/python"), "-c", code], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    site = str(top / ".site-vllm")
    assert r.stdout.splitlines()[-4:] == [site, "True", "[] True", os.pathsep.join([site, "/x"])]


def test_bundle_vllm_deps_follow_pyproject():
    """bundle.VLLM_DEPS carries the bounds of pyproject's vllm-cpu-deps (the CPU tests' set):
    each spec appears there as written."""
    import re

    pytest.importorskip("rich")
    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("vllm-cpu-deps = [", 1)[1].split("]", 1)[0]
    declared = {re.sub(r"\s+", "", s) for s in re.findall(r'"([^"]+)"', block)}
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from deepinfer.bundle import VLLM_DEPS
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert VLLM_DEPS and not [s for s in VLLM_DEPS if s.replace(" ", "") not in declared]


def test_bench_cache_leaves_out_upstream_gather_below_sm89(monkeypatch):
    """Upstream's gather decodes through tl.float8e4nv (SM89+): on an A100 / A6000 the bench
    must leave its rows out with a reason instead of failing every gather row."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_cache as bc

    for cap in ((8, 0), (8, 6), (7, 5)):
        why = bc.upstream_gather_unsupported(cap)
        assert why and f"sm_{cap[0]}{cap[1]}" in why and "SM89" in why
    for cap in ((8, 9), (9, 0), (10, 0), (12, 0)):
        assert bc.upstream_gather_unsupported(cap) is None


def test_bench_capability_override(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_cache as bc

    monkeypatch.setenv("DEEPINFER_BENCH_CAPABILITY", "8.6")
    assert bc.bench_capability() == (8, 6)
    assert bc.upstream_gather_unsupported(bc.bench_capability())
    monkeypatch.setenv("DEEPINFER_BENCH_CAPABILITY", "9.0")
    assert bc.upstream_gather_unsupported(bc.bench_capability()) is None


def _scripts_with_cli() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py")
                  if p.name != "_paths.py" and "argparse" in p.read_text())


@pytest.mark.parametrize("script", _scripts_with_cli())
def test_bench_script_help_runs_from_any_directory(script, tmp_path):
    """Every benchmark script with a command line finds overlay/ and the harness through
    bench/_paths.py: `python bench/NAME.py --help` from an unrelated directory exits 0 and
    prints its usage (an import that the path set-up misses fails here, on the CPU)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{script} --help: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "usage" in r.stdout.lower(), r.stdout


def test_bench_scripts_take_their_paths_from_one_module():
    """No benchmark script edits sys.path itself: bench/_paths.py is the one place (it was
    repeated in 22 scripts)."""
    offenders = [p.name for p in BENCH.glob("*.py")
                 if p.name not in ("_paths.py", "upstream_import.py")
                 and "sys.path.insert" in p.read_text()]
    assert offenders == []


def test_vllm_missing_modules_probe_finds_and_stubs_missing_ones():
    """scripts/device/vllm_missing_modules.py (run on the GPU box before the vLLM-level
    checks), against the applied tree with a module hidden: it names it, stubs it and
    boots the chain, exiting 1 (nothing else is missing here; the checks boot themselves)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import vllm_cpu_harness as harness
    finally:
        sys.path.remove(str(ROOT / "tests"))
    if harness.missing_dependencies():
        pytest.skip("vLLM's pure-Python dependencies are not installed")
    tree = ROOT / "build" / f"vllm-{harness.VLLM_VERSION}"
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.skip("no applied vLLM tree: run `make apply`")
    script = ROOT / "scripts" / "device" / "vllm_missing_modules.py"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, str(script), "--tree", str(tree), "--hide", "xgrammar"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[-2:] == [
        "missing: xgrammar", "the chain imports with these stubbed: ['xgrammar']"], r.stdout
