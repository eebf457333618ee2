"""DeepSeek-V4.1's output projection as it runs below family 100: ``dsv41_o_proj`` falls
back to V4's ``deep_gemm_fp8_o_proj``, and V4.1's ``wo_a`` is bf16 there (the MXFP8
emulation kernel dequantises it at load), so the path is the inverse-RoPE kernel with
``quantize=False`` (patch 3 makes it compile for sm_80) and a grouped ``torch.bmm``.
Upstream's function, imported from the applied tree, against the float64 oracle
``deepinfer_sm80.ampere.o_proj.o_proj_reference64``. (Here the kernel runs as sm_90 code;
the sm_80 compile of the same source is tests/test_gates_sm80.py's.)"""
from __future__ import annotations

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

_ROOT = pathlib.Path(__file__).resolve().parents[2]
for _p in (_ROOT / "overlay", _ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


@pytest.fixture(scope="module")
def o_proj_mod():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import upstream_import

    try:
        return upstream_import.import_upstream("vllm.models.deepseek_v4.nvidia.ops.o_proj")
    except upstream_import.UpstreamImportError as e:
        pytest.skip(f"V4's o_proj not importable from the applied tree: {e}")


@pytest.mark.parametrize("tokens,groups,hpg", [(1, 8, 8), (37, 8, 8), (300, 1, 8)])
def test_bf16_wo_a_path_matches_float64(o_proj_mod, tokens, groups, hpg):
    from deepinfer_sm80.ampere.o_proj import o_proj_reference64

    g = torch.Generator(device="cuda")
    g.manual_seed(int(torch.randint(0, 2**31 - 1, (1,)).item()))
    D, R, out_dim = 512, 1024, 256
    o = (torch.randn(tokens, groups * hpg, D, device="cuda", generator=g)).to(torch.bfloat16)
    pos = torch.randint(0, 8192, (tokens,), device="cuda", generator=g)
    cos_sin = torch.randn(8192, 64, device="cuda", generator=g)
    w = (torch.randn(groups * R, hpg * D, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    wo_a = torch.nn.Module()
    wo_a.weight = torch.nn.Parameter(w, requires_grad=False)
    wo_b = (torch.randn(out_dim, groups * R, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    out = o_proj_mod.deep_gemm_fp8_o_proj(
        o, pos, cos_sin, wo_a, lambda z: z @ wo_b.t(), n_groups=groups, heads_per_group=hpg,
        nope_dim=448, rope_dim=64, o_lora_rank=R, einsum_recipe=(1, 128, 128),
        tma_aligned_scales=False)
    torch.cuda.synchronize()
    ref = o_proj_reference64(o, pos, cos_sin, w.view(groups, R, hpg * D), wo_b)
    err = float((out.double() - ref).norm() / ref.norm())
    assert err <= 2e-2, err
