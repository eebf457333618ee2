"""CPU checks of bench/bench_mhc.py (vLLM's TileLang mHC kernels timed as SM80 code), which
otherwise first runs on a device call:

* its fp32 torch form of each kernel (the baseline and the check) against the float64
  references of tests/gpu/test_mhc_tilelang_sm80.py, which passed against the kernels on an
  H200 (read from that file: it skips on import without a GPU);
* the byte counts behind the floors, by hand;
* the whole ``bench()`` flow with the kernels replaced: every kernel, shape and row, the
  floors, and a wrong kernel failing the check;
* bench/mhc_sm80.py: vLLM's wrappers import under the capability-8.0 platform with PDL off,
  and the platform and device properties are restored afterwards."""
from __future__ import annotations

import ast
import importlib.util
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
GPU_TEST = ROOT / "tests" / "gpu" / "test_mhc_tilelang_sm80.py"


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    monkeypatch.setattr(common, "device_info", lambda: {"gpu": "cpu (flow test)"})
    spec = importlib.util.spec_from_file_location("bench_mhc_flow", BENCH / "bench_mhc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.DEVICE = "cpu"
    return mod


@pytest.fixture(scope="module")
def refs():
    """The GPU test's float64 reference functions, executed from its source."""
    tree = ast.parse(GPU_TEST.read_text())
    names = {"_mixes", "_rmsnorm_bf16_input", "mix_coefficients", "pre_ref", "post_ref",
             "hc_head_ref", "pre_delayed_ref"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in body} == names
    ns = {"torch": torch, "EPS": 1e-6, "POST_ALPHA": 2.0, "SINKHORN": 20}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(GPU_TEST), "exec"), ns)
    return types.SimpleNamespace(**{k: ns[k] for k in names})


def _close(a, b, rtol):
    a, b = a.double().reshape(b.shape), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30)) < rtol


@pytest.mark.parametrize("T", [1, 5])
def test_torch_forms_match_the_gpu_tests_references(bench, refs, T):
    g = torch.Generator().manual_seed(T)
    H = 64
    for kernel in ("pre", "post", "fused_post_pre", "fused_post_pre_delayed", "hc_head"):
        s = bench.make_set(kernel, T, H, g)
        got = bench.torch_call(kernel, s)()
        if kernel == "pre":
            want = refs.pre_ref(s["res"], s["fn"], s["scale"], s["base"], s["norm_w"])
        elif kernel == "post":
            want = (refs.post_ref(s["x"], s["res"], s["post_in"], s["comb_in"]),)
        elif kernel == "hc_head":
            want = (refs.hc_head_ref(s["res"], s["fn"], s["scale"], s["base"]),)
        else:
            cur = got[0]  # the bf16 streams the torch form projects (the kernels' >32 path)
            assert _close(cur, refs.post_ref(s["x"], s["res"], s["post_in"], s["comb_in"]),
                          1e-2), kernel
            if kernel == "fused_post_pre":
                want = (cur,) + tuple(refs.pre_ref(cur, s["fn"], s["scale"], s["base"],
                                                   s["norm_w"]))
            else:
                rp, rc, rl, rn = refs.pre_delayed_ref(cur, s["fn"], s["scale"], s["base"],
                                                      s["pre_in"], None, s["norm_w"])
                want = (cur, rp, rc, rl, rn)
        assert len(got) == len(want), kernel
        for i, (a, b) in enumerate(zip(got, want)):
            assert _close(a, b, 1e-2 if a.dtype == torch.bfloat16 else 1e-5), (kernel, i)


def test_bytes_moved_by_hand(bench):
    g = torch.Generator().manual_seed(0)
    T, H = 2, 8
    s = bench.make_set("post", T, H, g)
    # x 2x8 bf16, res 2x4x8 bf16, post_in 2x4x1 fp32, comb_in 2x4x4 fp32; out 2x4x8 bf16
    assert bench.bytes_moved("post", s) == 32 + 128 + 32 + 128 + 128
    s = bench.make_set("pre", T, H, g)
    # res 128, fn 24 x 32 fp32, scale 3, base 24, norm_w 8 bf16; out li 2x8 bf16 + mixes
    assert bench.bytes_moved("pre", s) == 128 + 3072 + 12 + 96 + 16 + 32 + 2 * 4 * 5 * 4
    s = bench.make_set("hc_head", T, H, g)
    assert bench.bytes_moved("hc_head", s) == 128 + 4 * 32 * 4 + 4 + 16 + 32


def _fake_wrappers(bench, broken: str | None = None):
    def w(kernel):
        def f(*a, **kw):
            s = _fake_wrappers.current
            out = bench.torch_call(kernel, s)()
            if kernel == broken:
                out = (torch.zeros_like(out[0]),) + tuple(out[1:])
            return out if len(out) > 1 else out[0]
        return f

    def delayed(*a, **kw):
        return w("fused_post_pre_delayed")(*a, **kw) + (torch.empty(0),)

    return types.SimpleNamespace(
        mhc_pre_tilelang=w("pre"), mhc_post_tilelang=w("post"),
        hc_head_fused_kernel_tilelang=w("hc_head"),
        mhc_fused_post_pre_tilelang=w("fused_post_pre"),
        mhc_fused_post_pre_delayed_tilelang=delayed)


@pytest.mark.parametrize("broken", [None, "fused_post_pre"])
def test_bench_flow(bench, monkeypatch, broken):
    import common

    orig = bench.tilelang_call

    def tilelang_call(wrappers, kernel, s):  # the fake wrappers compute on this set
        run = orig(wrappers, kernel, s)

        def call():
            _fake_wrappers.current = s
            return run()
        return call

    monkeypatch.setattr(bench, "tilelang_call", tilelang_call)

    def time_fn(calls, min_calls=1):
        for c in calls:
            c()
        return types.SimpleNamespace(median_us=2.0)

    report = common.Report(name="bench_mhc", title="t", columns=["kernel"])
    shapes = {"hidden": [("A", 64, ("pre", "post", "fused_post_pre", "hc_head")),
                         ("B", 32, ("fused_post_pre_delayed",))], "tokens": (1, 40)}
    bench.bench(report, _fake_wrappers(bench, broken), shapes, 1000.0, time_fn=time_fn)
    assert len(report.rows) == (4 + 1) * 2 * 2
    assert [r["impl"] for r in report.rows[:2]] == ["tilelang", "torch"]
    for r in report.rows:
        assert r["floor_us"] == pytest.approx(r["mb"] * 1e6 / 1000.0 / 1e3)
        assert r["pct_copy"] == pytest.approx(100 * r["floor_us"] / 2.0)
    failed = [c["what"] for c in report.checks if not c["ok"]]
    assert len(report.checks) == 10
    if broken is None:
        assert not failed
    else:
        assert len(failed) == 2 and all(broken in f for f in failed)


def test_agrees_takes_the_tolerance_from_the_kernels_dtypes(bench):
    """bf16 outputs get bf16 tolerances, fp32 mixes the tighter MIX_TOL, as the kernels return
    them (the first version picked them after converting both to fp32, so every output got
    MIX_TOL and a bf16 output one rounding step off failed: the 2026-12-05 09:27 device run)."""
    g = torch.Generator().manual_seed(7)
    want16 = (torch.randn(64, 128, generator=g) * 0.05).to(torch.bfloat16)
    got16 = want16.float() + 5e-3  # outside MIX_TOL near zero, inside BF16_TOL
    want32 = torch.rand(64, 4, generator=g)
    ok, err, why = bench.agrees((got16.to(torch.bfloat16), want32.clone()), (want16, want32))
    assert ok and not why and 0 < err < 0.5
    ok, _, why = bench.agrees((want16.clone(), want32 + 5e-3), (want16, want32))
    assert not ok and why.startswith("output 1 (fp32): ") and "outside" in why
    bad = want16.clone()
    bad[0, 0] = float("nan")
    ok, _, why = bench.agrees((bad, want32.clone()), (want16, want32))
    assert not ok and why.startswith("output 0 (bf16): 1 of 8192 outside")
    assert not bench.agrees((want16,), (want16, want32))[0]


HELPER_CHECK = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import mhc_sm80
real = torch.cuda.get_device_properties
with mhc_sm80.sm80_mhc() as (wrappers, kernels):
    import vllm.platforms as platforms
    inside = platforms._current_platform
    got = {"major": inside.get_device_capability().major, "pdl": bool(kernels.ENABLE_PDL),
           "wrapper": callable(wrappers.mhc_fused_post_pre_tilelang),
           "props_patched": torch.cuda.get_device_properties is not real}
got["props_restored"] = torch.cuda.get_device_properties is real
got["platform_restored"] = platforms._current_platform is not inside
print(json.dumps(got))
"""


def test_sm80_platform_helper_restores_what_it_changed():
    """In a fresh process (upstream_import refuses a vllm imported from elsewhere, and the
    suite's other tests import the overlay's)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("tilelang", reason="needs tilelang (make test installs vLLM's pin)")
    sys.path.insert(0, str(BENCH))
    try:
        import upstream_import

        upstream_import.find_tree()
    except Exception as e:
        pytest.skip(f"no applied vLLM tree: {e}")
    finally:
        sys.path.remove(str(BENCH))
    r = subprocess.run([sys.executable, "-c", HELPER_CHECK, str(BENCH)], capture_output=True,
                       text=True, timeout=300, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"major": 8, "pdl": False, "wrapper": True, "props_patched": True,
                   "props_restored": True, "platform_restored": True}, got
