"""CPU run of bench/marlin_vllm.py's whole ``main()`` on small shapes, with the GPU parts
replaced: vLLM's Marlin path by float64 stand-ins built from tests/vllm_marlin_check.py's own
decoders, CUDA-graph timing by one call per input set, the copy measurement by a constant.

What it checks is the script's own flow, which otherwise first runs on a device call: every
shape and token count produces its rows (both limit sets, and the bf16 row for the linears),
the correctness gate runs at both limit sets and fails a wrong kernel, the limits are set
back to the A100's after each row, every row gets its floor and percentage of the copy
bandwidth, and the JSON is written. Nothing here says anything about Marlin's speed or
numerics (tests/gpu/test_vllm_c_marlin_sm80.py and the benchmark itself on the GPU)."""
from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import vllm_c_marlin  # noqa: E402
import vllm_marlin_check as cases  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "bench"
OWN = (132, 227 * 1024)  # the stand-in GPU's own limits
SMALL = {"linears": [("t block", "block", 320, 256), ("t mx", "mx", 64, 128)],
         "tokens": (1, 3),
         "experts": [("t mxfp4", "mxfp4", 4, 2, 128, 64), ("t fp8", "fp8", 4, 2, 256, 128)],
         "moe_tokens": (1, 5)}


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("marlin_vllm_flow", BENCH / "marlin_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Lib:
    def __init__(self, log):
        self.log = log

    def set_limits(self, limits):
        self.log.append(tuple(limits))


def _applier(weight64, params, scale=1.0):
    layer = torch.nn.Module()
    for i, p in enumerate(params):
        layer.register_parameter(f"p{i}", torch.nn.Parameter(p, requires_grad=False))

    def apply(x):
        return (x.double() @ (scale * weight64).T).to(torch.bfloat16)

    apply.layer = layer
    return apply


def _install_stand_ins(monkeypatch, bench, tmp_path, *, linear_scale=1.0):
    """The GPU parts of the script replaced; returns the log of set_limits calls."""
    common = bench.common
    limits_log = []
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "QUICK", SMALL)
    monkeypatch.setattr(common, "require_cuda", lambda: None)
    monkeypatch.setattr(common, "device_info", lambda: {
        "gpu": "stand-in", "sm_count": OWN[0], "capability": "9.0", "l2_mib": 60.0,
        "torch": torch.__version__, "cuda_runtime": None, "triton": None, "python": "3"})
    monkeypatch.setattr(common, "copy_bandwidth", lambda: {"gbps_read_plus_write": 4000.0,
                                                           "method": "stand-in"})
    monkeypatch.setattr(common, "rotation_count", lambda *a, **k: 2)

    def graph_time(calls, *, min_calls=1, **_):
        for fn in calls:
            fn()
        return common.Timing(median_us=10.0, min_us=9.0, p25_us=9.5, p75_us=10.5,
                             calls_per_replay=max(len(calls), min_calls), replays=1)

    monkeypatch.setattr(common, "graph_time", graph_time)
    write_json = common.Report.write_json
    monkeypatch.setattr(common.Report, "write_json",
                        lambda self, results_dir=None: write_json(self, tmp_path))
    monkeypatch.setattr(bench.harness, "missing_dependencies", lambda: [])
    import upstream_import
    import vllm_builder_check

    monkeypatch.setattr(upstream_import, "find_tree", lambda **_: tmp_path / "tree")
    monkeypatch.setattr(vllm_builder_check, "boot", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(
        multi_processor_count=OWN[0], shared_memory_per_block_optin=OWN[1]))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(cases, "install_ops", lambda tree, limits: (
        limits_log.append(tuple(limits)) or _Lib(limits_log), _Lib(limits_log)))
    def block_linear(t, codes, scales, n, k):
        s = torch.pow(2.0, scales.view(torch.uint8).double() - 127)
        w = cases.e4m3_to_float(codes) * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
        return _applier(w, (codes, scales), linear_scale)

    monkeypatch.setattr(cases, "block_linear", block_linear)

    def mx_linear(t, codes, exps, n, k):
        s = torch.pow(2.0, exps.double() - 127).repeat_interleave(32, 1)
        return _applier(cases.e4m3_to_float(codes) * s, (codes, exps), linear_scale)

    monkeypatch.setattr(cases, "mx_linear", mx_linear)
    monkeypatch.setattr(cases, "prepare_mxfp4_experts", lambda t, *loaded: loaded)
    monkeypatch.setattr(cases, "prepare_fp8_experts", lambda t, *loaded: loaded)

    def marlin_experts(prepared, weights):
        k, n = prepared[1].shape[1], prepared[0].shape[1] // 2
        w13, w2 = cases.experts_float64(weights, prepared, k, n)
        return lambda x, topk_w, topk_ids: cases.moe_float64(
            x.double(), topk_w, topk_ids, w13, w2).to(torch.bfloat16)

    monkeypatch.setattr(cases, "marlin_experts", marlin_experts)
    return limits_log


def test_the_whole_script_runs_and_fills_every_row(bench, tmp_path, monkeypatch, capsys):
    limits_log = _install_stand_ins(monkeypatch, bench, tmp_path)
    # the GPU bundle's vLLM deps (.site-vllm) are on the path by the time the tree is imported
    # (the H200 run of 2026-12-05 stopped at `import pydantic` without this)
    deps = tmp_path / "site-vllm"
    deps.mkdir()
    monkeypatch.setenv("DEEPINFER_VLLM_DEPS", str(deps))
    monkeypatch.setattr(sys, "path", list(sys.path))
    import upstream_import

    seen = []
    monkeypatch.setattr(upstream_import, "find_tree",
                        lambda **_: seen.append(list(sys.path)) or tmp_path / "tree")
    assert bench.main(["--quick", "--no-doc"]) == 0
    assert seen and seen[0][0] == str(deps)
    out = capsys.readouterr().out
    (path,) = tmp_path.glob("marlin_vllm_*.json")
    got = json.loads(path.read_text())
    a100 = vllm_c_marlin.A100_LIMITS
    own = f"this GPU's ({OWN[0]} SMs, {OWN[1] // 1024} KB)"
    n_lin = len(SMALL["linears"]) * len(SMALL["tokens"])
    n_moe = len(SMALL["experts"]) * len(SMALL["moe_tokens"])
    assert len(got["rows"]) == 3 * n_lin + 2 * n_moe
    impls = [r["impl"] for r in got["rows"]]
    assert impls.count("bf16 matmul (cuBLAS, SM90 code)") == n_lin
    assert impls.count(f"marlin @ {own}") == n_lin + n_moe
    assert impls.count("marlin @ A100 limits (108 SMs, 163 KB)") == n_lin + n_moe
    for r in got["rows"]:
        assert r["floor_us"] == pytest.approx(r["bytes"] / 4e6)
        assert r["pct_copy"] == pytest.approx(100 * r["floor_us"] / r["median_us"])
        assert r["tflops"] > 0 and r["bytes"] > 0
    # the gate: every linear and every expert set at both limit sets, all passing
    assert len(got["checks"]) == 2 * (len(SMALL["linears"]) + len(SMALL["experts"]))
    assert all(c["ok"] for c in got["checks"]), got["checks"]
    # the limits: first the A100's, each row's own set, back to the A100's after it
    assert limits_log[0] == a100 and limits_log[-1] == a100
    assert set(limits_log) == {a100, OWN}
    # one line per row as it is measured (what a cut-short device call leaves in its log)
    assert out.count("\nrow: ") + out.startswith("row: ") == len(got["rows"])
    assert "copy_start: 4000 GB/s" in out


def test_the_gate_fails_a_wrong_linear(bench, tmp_path, monkeypatch):
    """A linear off by 3% (a wrong scale) fails the correctness gate, and the run's status."""
    _install_stand_ins(monkeypatch, bench, tmp_path, linear_scale=1.03)
    assert bench.main(["--quick", "--no-doc"]) == 1
    got = json.loads(next(tmp_path.glob("marlin_vllm_*.json")).read_text())
    failed = [c["what"] for c in got["checks"] if not c["ok"]]
    assert len(failed) == 2 * len(SMALL["linears"]), failed
    assert all("Marlin vs dequantised fp32" in w for w in failed)
