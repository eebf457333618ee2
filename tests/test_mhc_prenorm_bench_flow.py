"""CPU run of bench/bench_mhc_prenorm.py's flow with the GPU parts replaced: our projection
by an fp32 torch stand-in (and a broken one that drops fn's lo term), vLLM's wrappers by a
namespace whose pre block calls the module's projection as vLLM's does. Checks the rows, the
float64 gate (passes the stand-in, fails the broken one), the floors, and that the pre block
runs with our projection exactly in the rows that say so and gets vLLM's back afterwards."""
from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


@pytest.fixture()
def flow(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_mhc
    import common

    monkeypatch.setattr(common, "device_info", lambda: {"gpu": "cpu (flow test)"})
    monkeypatch.setattr(common, "rotation_count", lambda *a, **k: 2)
    monkeypatch.setattr(common, "graph_time",
                        lambda calls, **k: [c() for c in calls] and types.SimpleNamespace(median_us=2.0))
    monkeypatch.setattr(bench_mhc, "DEVICE", "cpu")
    spec = importlib.util.spec_from_file_location("bench_mhc_prenorm_flow",
                                                  BENCH / "bench_mhc_prenorm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, bench_mhc, common


def _projection(x, fn, *, terms=2):
    from deepinfer_sm80.reference import mhc as ref

    f = fn if terms == 2 else ref.split_bf16(fn)[0].float()
    return (x.float() @ f.float().t()).unsqueeze(0), x.float().square().sum(-1).unsqueeze(0)


def _fake_wrappers(bench_mhc, monkeypatch, vllm_projection):
    """vLLM's wrappers module as the bench sees it: ``_hc_prenorm_gemm_outputs`` and a pre
    block that calls the module's projection (as vLLM's does), then the torch pre block on
    the input set the bench handed ``tilelang_call``."""
    ns = types.SimpleNamespace(_hc_prenorm_gemm_outputs=vllm_projection)
    current = {}

    def pre(res, fn, *a, **kw):  # vLLM's pre block: the module's projection, then the rest
        ns._hc_prenorm_gemm_outputs(res.reshape(res.shape[0], -1), fn, hidden_size=res.shape[-1],
                                    hc_mult=4)
        return bench_mhc.torch_call("pre", current["s"])()

    ns.mhc_pre_tilelang = pre
    orig_call = bench_mhc.tilelang_call

    def tilelang_call(wrappers, kernel, s):
        current["s"] = s
        return orig_call(wrappers, kernel, s)

    monkeypatch.setattr(bench_mhc, "tilelang_call", tilelang_call)
    return ns


@pytest.mark.parametrize("broken", [False, True])
def test_flow(flow, monkeypatch, broken):
    mod, bench_mhc, common = flow
    from deepinfer_sm80.ops import mhc as op

    calls = {"ours": 0, "vllm": 0}

    def fake_op(x, fn, *, n_splits=None, sm_count=None):
        calls["ours"] += 1
        return _projection(x, fn, terms=1 if broken else 2)

    monkeypatch.setattr(op, "hc_prenorm_gemm", fake_op)

    def vllm_projection(x, fn, *, hidden_size, hc_mult, use_tilelang_fallback=True):
        calls["vllm"] += 1
        return _projection(x, fn)

    ns = _fake_wrappers(bench_mhc, monkeypatch, vllm_projection)
    report = common.Report(name="t", title="t", columns=["what"])
    mod.bench(report, ns, {"hidden": (("A", 64), ("B", 128)), "tokens": (1, 70)}, 1000.0)
    assert ns._hc_prenorm_gemm_outputs is vllm_projection  # restored
    assert [r["impl"] for r in report.rows[:4]] == [
        f"ours ({op.choose_splits(1, 256, 108)} splits)", "vLLM TileLang fallback", "vLLM",
        "vLLM with our projection"]
    assert len(report.rows) == 2 * 2 * 4
    for r in report.rows:
        assert r["pct_copy"] == pytest.approx(100 * r["floor_us"] / 2.0)
    r0 = report.rows[0]
    assert r0["floor_us"] == pytest.approx(mod.projection_bytes(1, 64, op.choose_splits(1, 256, 108)) / 1e6)
    # our projection ran in our rows and in the pre rows that say so, and nowhere else
    # per shape: ours = its check + 2 timed sets + the pre check + 2 timed pre sets; vLLM's =
    # its error note + 2 timed sets + the pre baseline + 2 timed pre sets
    assert calls == {"ours": 4 * 6, "vllm": 4 * 6}
    proj = [c for c in report.checks if c["what"].startswith("projection")]
    assert len(proj) == 4 and all(c["ok"] for c in proj) == (not broken)
    assert all(c["ok"] for c in report.checks if c["what"].startswith("pre"))


def test_projection_bytes_by_hand(flow):
    mod = flow[0]
    # x 3 x 4*8 bf16, fn 24 x 32 fp32, out + sqrsum 2 splits x 3 x 25 fp32
    assert mod.projection_bytes(3, 8, 2) == 3 * 32 * 2 + 24 * 32 * 4 + 2 * 3 * 25 * 4


def test_flow_with_patch_9(flow, monkeypatch):
    """A tree carrying patch 9: vLLM's projection asks the router (``_kernel_loads``) and runs
    ours when it answers True. The fallback rows must still time upstream's fallback (the
    router forced to False), the routed rows ours, and the router is restored afterwards."""
    mod, bench_mhc, common = flow
    from deepinfer_sm80.ops import mhc as op

    calls = {"ours": 0, "vllm": 0}

    def fake_op(x, fn, *, n_splits=None, sm_count=None):
        calls["ours"] += 1
        return _projection(x, fn)

    monkeypatch.setattr(op, "hc_prenorm_gemm", fake_op)

    def kernel_loads():
        return True

    router = types.SimpleNamespace(_kernel_loads=kernel_loads,
                                   ampere_prenorm_gemm_serves=lambda k, n: router._kernel_loads())

    def vllm_projection(x, fn, *, hidden_size, hc_mult, use_tilelang_fallback=True):
        if router.ampere_prenorm_gemm_serves(x.shape[1], fn.shape[0]):
            return fake_op(x, fn)
        calls["vllm"] += 1
        return _projection(x, fn)

    ns = _fake_wrappers(bench_mhc, monkeypatch, vllm_projection)
    report = common.Report(name="t", title="t", columns=["what"])
    mod.bench(report, ns, {"hidden": (("A", 64),), "tokens": (1,)}, 1000.0, router)
    assert router._kernel_loads is kernel_loads  # restored
    assert [r["impl"] for r in report.rows] == [
        f"ours ({op.choose_splits(1, 256, 108)} splits)", "vLLM TileLang fallback",
        "vLLM routed (patch 9)", "vLLM", "vLLM with our projection", "vLLM routed (patch 9)"]
    # upstream's fallback ran exactly in the fallback rows: its error note + 2 timed sets, the
    # pre baseline + 2 timed pre sets
    assert calls["vllm"] == 6
    # ours: check + 2 timed, routed check + 2 timed, 2 pre checks + 2 x 2 timed pre sets
    assert calls["ours"] == 3 + 3 + 2 + 4
    assert all(c["ok"] for c in report.checks), report.checks
    assert any("routes vLLM to ours" in c["what"] for c in report.checks)
