"""Dispatch decisions of the patched vLLM 0.33.0 tree vs the pristine one (CPU).

Both trees come from one `deepinfer apply` into a temporary build directory: the
patched tree is its HEAD (base + series + overlay), the pristine tree is its base
commit. Each tree is imported in a subprocess with vLLM's pure-Python dependencies
and a CUDA platform mocked to capabilities 12.0, 10.0, 9.0, 8.9, 8.6 and 8.0
(tests/vllm_cpu_harness.py), once with stand-in ``cutlass``/``deep_gemm`` packages
installed and once without.

- 8.0 / 8.6 (and 8.9): every selection point picks the SM80 implementation
  (expectations below), and the pristine tree decides differently at each of them
  (so reverting a patch flips a decision this test checks).
- 9.0 / 10.0 / 12.0: every decision equals the pristine tree's.
- 8.0 / 8.6: vLLM's quantised-GEMM selectors (linears, MoE experts) pick Marlin, in
  both trees (no patch needed there).

Marked ``network``: the apply needs the vLLM sdist (downloaded once, then cached).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import vllm_cpu_harness as harness

pytestmark = pytest.mark.network

SM8X = ("8.9", "8.6", "8.0")  # 8.9 (Ada): FlashMLA does not run there either
SM9PLUS = ("12.0", "10.0", "9.0")
#: Newest first: a decision cached by an earlier capability would leak into SM8x and
#: break the SM8x expectations (a mismatch, never a false agreement).
CAPABILITIES = list(SM9PLUS + SM8X)

AMPERE_CLS = "vllm.models.deepseek_v4.nvidia.ampere_sparse.DeepseekV4AmpereSparseAttention"
AMPERE_V41_CLS = ("vllm.models.deepseek_v41.nvidia.ampere_sparse."
                  "DeepseekV41AmpereSparseAttention")


def _refused(decision: Any, *words: str) -> bool:
    return (isinstance(decision, dict) and decision.get("error") == "ValueError"
            and all(w in decision["message"] for w in words))


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    harness.skip_without_dependencies()
    return harness.prepare_trees(tmp_path_factory)


@pytest.fixture(scope="module")
def decisions(trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> dict[tuple[str, str], dict[str, Any]]:
    """(tree, "installed"|"absent") -> capability -> probe -> decision."""
    fakes = harness.make_fake_packages(tmp_path_factory.mktemp("site"))
    jobs = {(t, inst): (trees[t], fakes if inst == "installed" else None)
            for t in trees for inst in ("installed", "absent")}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(harness.run_probes, tree, CAPABILITIES,
                                    installed=installed)
                   for key, (tree, installed) in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


# ------------------------------------------------------------------------- SM90+ same


@pytest.mark.parametrize("installed", ["installed", "absent"])
@pytest.mark.parametrize("cap", SM9PLUS)
def test_sm90_plus_decisions_equal_upstream(decisions, cap: str, installed: str) -> None:
    patched = decisions[("patched", installed)][cap]
    pristine = decisions[("pristine", installed)][cap]
    for probe, want in pristine.items():
        got = patched[probe]
        if probe in ("attention_warmup", "backend_support"):
            got = {k: v for k, v in got.items() if k in want}  # the SM80 backend is new
        assert got == want, f"{probe} at {cap} ({installed}): patched {got} != {want}"
    # Probes that error out in both trees would compare equal without testing anything.
    errored = [p for p, d in pristine.items() if isinstance(d, dict) and "error" in d]
    assert not errored, f"probes failed to run: {errored}"


# ---------------------------------------------------------------------- SM8x: Ampere


def _expect_sm8x(d: dict[str, Any]) -> list[str]:
    """Return the list of violated expectations for one SM8x capability."""
    bad = []

    def check(cond: bool, what: str) -> None:
        if not cond:
            bad.append(what)

    attn = d["attn_cls"]
    check(attn["None"] == AMPERE_CLS, f"default backend -> {attn['None']}")
    check(attn["TRITON_MLA"] == AMPERE_CLS, f"unrelated backend -> {attn['TRITON_MLA']}")
    for b in ("FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE_DSV4"):
        check(_refused(attn[b], b, "9.0", "Leave the attention backend unset"),
              f"{b} not refused: {attn[b]}")
    for b in ("FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120"):
        check(_refused(attn[b], "not a DeepSeek V4 attention backend"), f"{b}: {attn[b]}")
    v41 = d["v41_attn_cls"]
    check(v41["None"] == AMPERE_V41_CLS, f"V4.1 default backend -> {v41['None']}")
    check(v41["TRITON_MLA"] == AMPERE_V41_CLS, f"V4.1 unrelated backend -> {v41['TRITON_MLA']}")
    for b in ("FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV41", "FLASHMLA_MEGA_ATTN_DSV41",
              "FLASHINFER_MLA_SPARSE_DSV41"):
        check(_refused(v41[b], b, "9.0", "Leave the attention backend unset"),
              f"V4.1 with {b} not refused: {v41[b]}")
    check(_refused(v41["FLASHINFER_MLA_SPARSE"], "not a DeepSeek V4.1 attention backend"),
          f"V4.1 with FLASHINFER_MLA_SPARSE: {v41['FLASHINFER_MLA_SPARSE']}")
    pcp = v41["None/pcp2"]
    check(isinstance(pcp, dict) and pcp.get("error") == "NotImplementedError"
          and "prefill context parallelism" in pcp["message"], f"V4.1 with PCP: {pcp}")
    check(len(v41) == 8, f"V4.1 probe cases: {sorted(v41)}")
    check(d["v41_fp8_launch"] == {
        "rope_quant_insert_584": "e4m3_encode", "indexer_k_store/fp4=False": "e4m3_encode",
        "indexer_k_store/fp4=True": None,  # MXFP4 has no FP8 conversion
        "engram_lookup": {"decoder": "e4m3_decode", "table": "torch.uint8"}},
        f"V4.1 FP8 launchers -> {d['v41_fp8_launch']}")
    check(d["gather"] == "triton", f"gather -> {d['gather']}")
    check(d["indexer_q"] == {"fp8": "triton_fp8", "mxfp4": "triton_mxfp4"},
          f"indexer_q -> {d['indexer_q']}")
    check(d["compressor_store"] == {"512": "triton", "128": "triton"},
          f"compressor store -> {d['compressor_store']}")
    save = "warmup:SavePartialStatesKernel.kernel"
    check(all(v == [save] for v in d["compressor_warmup"].values()),
          f"compressor warmups -> {d['compressor_warmup']}")
    check(d["indexer_warmup"] == {"fp8": [], "mxfp4": []},
          f"indexer warmups -> {d['indexer_warmup']}")
    ampere_warm = d["attention_warmup"].get("ampere", [])
    check(bool(ampere_warm) and not any("CUTEDSL" in w or "Dequantize" in w or "Combine" in w
                                        for w in ampere_warm),
          f"SM80 attention warmups -> {ampere_warm}")
    check("warmup:_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL"
          not in d["attention_warmup"]["FLASHMLA_SPARSE_DSV4"],
          "CuTeDSL gather warmed up below 9.0")
    check(d["backend_support"] == {"FLASHMLA": False, "FLASHINFER": False, "ampere": True},
          f"backends supporting this capability -> {d['backend_support']}")
    check(d["tile_scheduler"] == "calls=0 types=-", f"tile scheduler -> {d['tile_scheduler']}")
    check(d["indexer_decode_metadata"] == "none",
          f"DeepGEMM schedule metadata -> {d['indexer_decode_metadata']}")
    check(d["inv_rope_warmup"] and all(not k["quantize"] for k in d["inv_rope_warmup"]),
          f"inverse RoPE warmup keys -> {d['inv_rope_warmup']}")
    check(d["o_proj"] == {"fp8": "!RuntimeError", "int32": "!RuntimeError",
                          "bf16": "inv_rope(quantize=False)+wo_b"}, f"o_proj -> {d['o_proj']}")
    check(str(d["sparse_indexer_init"]).startswith("refused:")
          and "9.0" in d["sparse_indexer_init"],
          f"DeepGEMM indexer -> {d['sparse_indexer_init']}")
    check(d["mhc_broadcast_route"] == "tilelang_pre",
          f"first-layer mHC pre -> {d['mhc_broadcast_route']}")
    return bad


@pytest.mark.parametrize("cap", SM8X)
def test_sm8x_selects_ampere_with_cutlass_and_deep_gemm_installed(decisions, cap: str
                                                                   ) -> None:
    assert _expect_sm8x(decisions[("patched", "installed")][cap]) == []


@pytest.mark.parametrize("cap", SM8X)
def test_sm8x_selects_ampere_without_them(decisions, cap: str) -> None:
    d = decisions[("patched", "absent")][cap]
    bad = _expect_sm8x(d)
    # Without deep_gemm the refusal is upstream's own message.
    bad = [b for b in bad if not b.startswith("DeepGEMM indexer")]
    assert str(d["sparse_indexer_init"]).startswith("refused:")
    assert bad == []


@pytest.mark.parametrize("cap", SM8X)
def test_pristine_tree_decides_otherwise_on_sm8x(decisions, cap: str) -> None:
    """The expectations fail on the unpatched tree, probe by probe: each patch is
    needed for the decisions it is tested for."""
    d = decisions[("pristine", "installed")][cap]
    assert d["attn_cls"]["None"].endswith("DeepseekV4FlashMLAAttention")
    assert d["v41_attn_cls"]["None"].endswith("deepseek_v41.nvidia.flashmla."
                                              "DeepseekV4FlashMLAAttention")
    assert d["v41_attn_cls"]["None/pcp2"] == d["v41_attn_cls"]["None"]
    assert d["v41_fp8_launch"]["rope_quant_insert_584"] is None
    assert d["v41_fp8_launch"]["engram_lookup"]["table"] == "torch.float8_e4m3fn"
    assert d["gather"] == "_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL"
    assert d["indexer_q"]["fp8"] == "_INDEXER_Q_FP8_KERNEL"
    assert d["compressor_store"]["512"] == "_SPARSE_ATTN_COMPRESSOR_CUTEDSL_KERNEL"
    assert d["indexer_warmup"]["fp8"] == ["warmup:_INDEXER_Q_FP8_KERNEL"]
    assert d["tile_scheduler"] == "calls=2 types=c4a,swaonly"
    assert d["indexer_decode_metadata"] == "deep_gemm_schedule"
    assert d["inv_rope_warmup"][0]["quantize"] is True
    assert "fp8_einsum" in d["o_proj"]["fp8"]
    assert d["sparse_indexer_init"] == "constructed"
    assert d["mhc_broadcast_route"] == "deep_gemm"  # DeepGEMM, which SM8x lacks
    absent = decisions[("pristine", "absent")][cap]
    assert absent["indexer_warmup"]["fp8"] == ["warmup:FusedIndexerQRopeQuantTritonKernel.kernel"]
    assert any("indexer_attn" in w for w in absent["compressor_warmup"]["128/c4"])
    # and the SM8x expectations reject the pristine decisions
    assert len(_expect_sm8x(d)) >= 10


@pytest.mark.parametrize("installed", ["installed", "absent"])
@pytest.mark.parametrize("cap", ("8.6", "8.0"))
def test_sm8x_quantised_gemms_take_marlin(decisions, cap: str, installed: str) -> None:
    """vLLM's own selectors give every quantised GEMM of V4 and V4.1 a Marlin kernel on
    Ampere (weight-only: FP8 blocks, MXFP8, MXFP4 experts; V4-Flash-Base's FP8 experts),
    at TP 1, TP 8 and EP 8, with or without DeepGEMM / CUTLASS DSL installed. Upstream
    needs no patch here (the upstream map lists these as portable): the pristine tree
    decides the same."""
    got = decisions[("patched", installed)][cap]["quant_kernels"]
    assert "error" not in got, got
    assert len(got) == 3 + 3 * 3 + 3, sorted(got)  # linears, MXFP4 MoE, FP8 MoE
    for case, kernel in got.items():
        if case.startswith("moe_"):
            assert kernel == {"backend": "MARLIN", "experts": "MarlinExperts"}, (case, kernel)
        else:
            assert kernel.startswith("Marlin"), (case, kernel)
    assert decisions[("pristine", installed)][cap]["quant_kernels"] == got

def test_multi_capability_process_matches_a_fresh_one(trees, decisions, tmp_path_factory
                                                       ) -> None:
    """No decision leaks from one probed capability into the next."""
    fakes = harness.make_fake_packages(tmp_path_factory.mktemp("site1"))
    fresh = harness.run_probes(trees["patched"], ["8.0"], installed=fakes)
    assert fresh["8.0"] == decisions[("patched", "installed")]["8.0"]
