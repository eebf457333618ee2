"""vLLM's quantised GEMMs on SM80 (Marlin), as vLLM runs them. Linears: its own Python
(``MarlinFP8ScaledMMLinearKernel`` for V4's FP8-block linears, ``MarlinMxfp8LinearKernel`` for
V4.1's MXFP8 linears: weight repack, scale permutation, padding, ``torch.ops.vllm.marlin_gemm``)
over vLLM's Marlin kernels built from the tree as SM80 code (``tests/vllm_c_marlin.py``), with
the host code answered as an A100 (capability 8.0, 108 SMs, 163 KB) or an A6000 would
(``--limits``), on this machine's GPU.

Each case builds a layer the way vLLM's loader leaves it (an [N, K] e4m3 weight and its
scales: fp32 or UE8M0 128 x 128 blocks, or e8m0 bytes per 32 along K), runs the kernel class's
``process_weights_after_loading`` and ``apply_weights`` for several token counts, and compares
with a float64 oracle written from the format (code x scale, then x @ W^T). Controls feed a
wrong scale layout and must fail.

The MoE cases run V4's MXFP4 routed experts (``prepare_moe_mxfp4_layer_for_marlin``) and
V4-Flash-Base's FP8 experts (``prepare_fp8_moe_layer_for_marlin``) through vLLM's
``fused_marlin_moe`` (SiLU with the swiglu clamp) over vLLM's Marlin MoE kernels built the
same way, and the two small compiled ops that path also calls (``moe_align_block_size``,
``silu_and_mul_with_clamp``) built from the tree by tests/vllm_c_ops.py; the ``op_`` cases
check those two by themselves against their documented contracts.

Prints one line ``RESULT {case: {"ok", "runs": [{"m", "rel_err", "max_abs_err"}], ...}}``."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_builder_check as checks  # noqa: E402
import vllm_c_marlin  # noqa: E402
import vllm_c_ops  # noqa: E402

#: bf16 output of fp32 sums: a few units of bf16's 2^-9 relative rounding; 1e-2 is the
#: project's bf16-level bound.
REL_TOL = 1e-2
#: Token counts: one decode row (m_block_size_8), a few rows, one 64-row block, more rows than
#: one launch takes (upstream splits m into launches of at most 4 x 16 x par rows).
TOKENS = (1, 5, 64, 300)

#: name -> (format, N, K, scale form). N, K from V4-Flash / V4.1 layers: 576 = the KV
#: projection's 512 + 64 (not a multiple of the 128 block: vLLM cuts the repeated scales),
#: 1536 / 4096 the Q low-rank and hidden sizes; MXFP8's 5120 x 1792 from V4.1.
CASES = {
    "fp8_block_fp32_scales_1536x4096": ("block", 1536, 4096, "fp32"),
    "fp8_block_ue8m0_scales_576x4096": ("block", 576, 4096, "ue8m0"),
    "fp8_block_fp32_scales_4096x1536": ("block", 4096, 1536, "fp32"),
    "mxfp8_1792x5120": ("mx", 1792, 5120, "e8m0"),
    "mxfp8_576x1024": ("mx", 576, 1024, "e8m0"),
    # Controls: the scales' two block axes swapped (block) / rows shuffled (mx) before
    # loading. Must be reported as failures.
    "control_block_scales_transposed": ("block", 1024, 1024, "fp32-transposed"),
    "control_mx_scales_shuffled": ("mx", 1024, 1024, "e8m0-shuffled"),
}
#: Routed experts through ``fused_marlin_moe`` (V4's SiLU with the swiglu clamp):
#: name -> (experts, top-k, hidden K, intermediate N, form). V4-Flash routes each token to 6
#: of 256 experts; fewer experts here keep every expert busy at small token counts.
MOE_CASES = {
    "mxfp4_moe_e16_top6_2048x1024": (16, 6, 2048, 1024, "mxfp4"),
    "mxfp4_moe_e8_top6_4096x512": (8, 6, 4096, 512, "mxfp4"),
    # V4-Flash-Base's FP8 experts (expert_dtype "fp8": 128 x 128 blocks, UE8M0 scales);
    # N = 256 is a TP-8 shard of a 2048-wide expert.
    "fp8_block_moe_e16_top6_2048x256": (16, 6, 2048, 256, "fp8-block"),
    # Control: the gate and up halves of w13 swapped at loading. Must be reported as failing.
    "control_moe_gate_up_swapped": (8, 6, 2048, 512, "mxfp4-swapped"),
}
CASES.update({n: ("moe", *MOE_CASES[n][:4]) for n in MOE_CASES})
#: The two small ops of the MoE path by themselves (``run_op_case``).
OP_CASES = ("op_silu_and_mul_with_clamp", "op_moe_align_block_size")
CASES.update({n: ("op", 0, 0, "") for n in OP_CASES})
CONTROLS = tuple(n for n in CASES if n.startswith("control_"))
#: V4's swiglu_limit: silu(min(gate, 10)) * clamp(up, -10, 10)
SWIGLU_LIMIT = 10.0

DEVICE = "cuda"


def e4m3_to_float(codes):
    """e4m3fn bytes -> float64, by the format (no FP8 dtype used): sign, 4 exponent bits
    (bias 7), 3 mantissa bits, subnormals at exponent 0."""
    import torch

    c = codes.to(torch.int64)
    sign = torch.where((c & 0x80) != 0, -1.0, 1.0).double()
    e, mant = (c >> 3) & 0xF, (c & 7).double()
    normal = (1 + mant / 8) * torch.pow(2.0, (e - 7).double())
    sub = mant / 8 * 2.0 ** -6
    return sign * torch.where(e == 0, sub, normal)


def random_codes(g, n, k):
    """Random e4m3 codes without the NaN codes (0x7F, 0xFF), as an [n, k] uint8 tensor."""
    import torch

    c = torch.randint(0, 256, (n, k), dtype=torch.uint8, generator=g)
    return torch.where((c & 0x7F) == 0x7F, c ^ 1, c)


def _layer(torch, weight, scales, scale_name, n, k, block):
    """A module with what vLLM's linear layer holds after loading and its FP8 / MXFP8 linear
    methods read."""
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    setattr(layer, scale_name, torch.nn.Parameter(scales, requires_grad=False))
    layer.output_size_per_partition, layer.input_size_per_partition = n, k
    layer.orig_dtype = torch.bfloat16
    layer.weight_block_size = block
    layer.bias = None
    return layer


def block_case(torch, g, n, k, form):
    """V4's FP8-block linear: [N, K] e4m3 weight, [ceil(N/128), K/128] scales (fp32
    ``weight_scale_inv``, or UE8M0 bytes as float8_e8m0fnu)."""
    codes = random_codes(g, n, k)
    bn, bk = -(-n // 128), k // 128
    if form.startswith("ue8m0"):
        exps = torch.randint(115, 124, (bn, bk), dtype=torch.uint8, generator=g)
        scale64 = torch.pow(2.0, exps.double() - 127)
        scales = exps.view(torch.float8_e8m0fnu)
    else:
        scales = (torch.rand((bn, bk), generator=g, dtype=torch.float64) * 3e-3 + 1e-4).float()
        scale64 = scales.double()
    w64 = e4m3_to_float(codes) * scale64.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    loaded = scales.T.contiguous() if form.endswith("transposed") else scales  # control: bn == bk
    return w64, block_linear(torch, codes.to(DEVICE), loaded.to(DEVICE), n, k)


def block_linear(torch, codes, scales, n, k):
    """vLLM's Marlin FP8-block linear over [N, K] e4m3 codes (uint8) and their 128 x 128 block
    scales, both on the GPU: ``process_weights_after_loading`` run; returns ``x -> y``."""
    from vllm.model_executor.kernels.linear.scaled_mm.marlin import (
        MarlinFP8ScaledMMLinearKernel,
    )

    layer = _layer(torch, codes.view(torch.float8_e4m3fn), scales, "weight_scale_inv", n, k,
                   [128, 128])
    # The kernel object as vLLM's FP8 linear method holds it; __init__ is left out because
    # it also builds an activation quantizer (QuantFP8) that the weight-only Marlin path
    # never calls. The attributes are those its __init__ sets for a block-quantised layer.
    kernel = object.__new__(MarlinFP8ScaledMMLinearKernel)
    kernel.marlin_input_dtype, kernel.block_quant, kernel.size_k_first = None, True, False
    kernel.process_weights_after_loading(layer)
    return _applier(kernel, layer)


def _applier(kernel, layer):
    """``x -> kernel.apply_weights(layer, x)``, with the layer (its prepared tensors) kept as
    ``.layer``."""
    def apply(x):
        return kernel.apply_weights(layer, x)

    apply.layer = layer
    return apply


def mx_case(torch, g, n, k, form):
    """V4.1's MXFP8 linear: [N, K] e4m3 weight, [N, K/32] e8m0 scale bytes."""
    codes = random_codes(g, n, k)
    exps = torch.randint(115, 124, (n, k // 32), dtype=torch.uint8, generator=g)
    w64 = e4m3_to_float(codes) * torch.pow(2.0, exps.double() - 127).repeat_interleave(32, 1)
    loaded = exps
    if form.endswith("shuffled"):
        loaded = exps[torch.randperm(n, generator=g)].contiguous()
    return w64, mx_linear(torch, codes.to(DEVICE), loaded.to(DEVICE), n, k)


def mx_linear(torch, codes, exps, n, k):
    """vLLM's Marlin MXFP8 linear over [N, K] e4m3 codes (uint8) and [N, K/32] e8m0 bytes, both
    on the GPU: ``process_weights_after_loading`` run; returns ``x -> y``."""
    from vllm.model_executor.kernels.linear.mxfp8.marlin import MarlinMxfp8LinearKernel

    layer = _layer(torch, codes.view(torch.float8_e4m3fn), exps, "weight_scale", n, k, None)
    kernel = object.__new__(MarlinMxfp8LinearKernel)  # its __init__ only stores the config
    kernel.process_weights_after_loading(layer)
    return _applier(kernel, layer)


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_to_float(packed, k):
    """[..., k / 2] bytes of e2m1 pairs (low nibble first) -> [..., k] float64."""
    import torch

    lut = torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=torch.float64,
                       device=packed.device)
    p = packed.to(torch.int64)
    return torch.stack([lut[p & 0xF], lut[p >> 4]], -1).reshape(*packed.shape[:-1], k)


def experts_float64(weights: str, loaded, k: int, n: int):
    """Loaded experts as meant, in float64: (w13 [E, 2N, K], w2 [E, K, N]) from ``loaded`` =
    (w13, w2, w13 scales, w2 scales), uint8. ``weights`` "mxfp4": e2m1 pairs (low nibble
    first), e8m0 bytes per 32 along K; "fp8": e4m3 codes, UE8M0 bytes per 128 x 128 block."""
    import torch

    a, b, sa, sb = loaded

    def pow2(exps):
        return torch.pow(2.0, exps.double() - 127)

    if weights == "mxfp4":
        return (e2m1_to_float(a, k) * pow2(sa).repeat_interleave(32, -1),
                e2m1_to_float(b, n) * pow2(sb).repeat_interleave(32, -1))

    def blocks(codes, exps):
        s = pow2(exps).repeat_interleave(128, -2)[..., :codes.shape[-2], :]
        return e4m3_to_float(codes) * s.repeat_interleave(128, -1)

    return blocks(a, sa), blocks(b, sb)


def moe_float64(x64, topk_w, topk_ids, w13_64, w2_64):
    """V4's routed experts in float64: per expert, the rows routed to it through w13 [E, 2N, K],
    SiLU of the gate clamped above at the swiglu limit times the up half clamped to +-limit,
    w2 [E, K, N], weighted by ``topk_w`` and summed over the top-k."""
    import torch

    n = w2_64.shape[-1]
    out = torch.zeros(x64.shape[0], w2_64.shape[-2], dtype=torch.float64, device=x64.device)
    for ex in range(w13_64.shape[0]):  # the rows routed to each expert, as one product
        t, j = torch.nonzero(topk_ids == ex, as_tuple=True)
        if t.numel() == 0:
            continue
        h = x64[t] @ w13_64[ex].T
        gate = h[:, :n].clamp(max=SWIGLU_LIMIT)
        up = h[:, n:].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
        y = (gate * torch.sigmoid(gate) * up) @ w2_64[ex].T
        out.index_add_(0, t, y * topk_w[t, j].double()[:, None])
    return out


def silu_clamp_reference(input, limit):
    """silu(min(gate, limit)) * clamp(up, +-limit) in float32 (vLLM's stated contract:
    ``fused_moe/activation.py``, its XPU branch and the op's comment), rounded to the input's
    dtype."""
    import torch

    d = input.shape[-1] // 2
    gate = input[..., :d].float().clamp(max=limit)
    up = input[..., d:].float().clamp(min=-limit, max=limit)
    return (gate * torch.sigmoid(gate) * up).to(input.dtype)


def check_moe_alignment(topk_ids, num_experts, block_size, sorted_ids, expert_ids, total):
    """moe_align_block_size's documented contract (``moe_align_block_size.py``): the routed
    rows grouped by expert, each group padded to a multiple of ``block_size`` with the value
    ``topk_ids.numel()``, one expert id per block, the padded total. The order inside a
    group is free. Returns the list of violations."""
    import torch

    flat = topk_ids.flatten().long().cpu()
    sorted_ids, expert_ids = sorted_ids.cpu().long(), expert_ids.cpu().long()
    total = int(total.cpu()[0])
    bad, pos = [], 0
    for e in range(num_experts):
        rows = torch.nonzero(flat == e).flatten()
        if rows.numel() == 0:
            continue
        padded = -(-rows.numel() // block_size) * block_size
        got = sorted_ids[pos:pos + padded]
        if sorted(got[:rows.numel()].tolist()) != rows.tolist():
            bad.append(f"expert {e}: rows {sorted(got[:rows.numel()].tolist())[:8]}...")
        if (got[rows.numel():] != flat.numel()).any():
            bad.append(f"expert {e}: padding is not {flat.numel()}")
        if (expert_ids[pos // block_size:(pos + padded) // block_size] != e).any():
            bad.append(f"expert {e}: block expert ids")
        pos += padded
    if total != pos:
        bad.append(f"num_tokens_post_pad {total} != {pos}")
    return bad


def run_op_case(torch, name: str, g, seed: int) -> dict:
    """The two small compiled ops by themselves, on fresh inputs."""
    if name == "op_silu_and_mul_with_clamp":
        runs = []
        for rows, d in ((1, 1024), (300, 1024), (7, 256), (5, 100)):  # 100: the scalar path
            x = (torch.randn((rows, 2 * d), generator=g) * 8).to(torch.bfloat16)
            out = torch.full((rows, d), float("nan"), dtype=torch.bfloat16, device=DEVICE)
            torch.ops._C.silu_and_mul_with_clamp(out, x.to(DEVICE), SWIGLU_LIMIT, 1.0, 0.0)
            ref = silu_clamp_reference(x, SWIGLU_LIMIT).float()
            got = out.float().cpu()
            ulp = (ref.abs().clamp(min=2.0 ** -126) * 2.0 ** -7)  # one bf16 ulp, bounding
            runs.append({"shape": [rows, d], "max_abs_err": float((got - ref).abs().max()),
                         "within_one_ulp": bool(((got - ref).abs() <= ulp).all()),
                         "finite": bool(torch.isfinite(got).all())})
        return {"ok": all(r["within_one_ulp"] and r["finite"] for r in runs), "runs": runs,
                "seed": seed}
    if name == "op_moe_align_block_size":
        from vllm.model_executor.layers.fused_moe.moe_align_block_size import (
            moe_align_block_size,
        )

        runs = []
        for m, e, top_k, bs in ((1, 16, 6, 8), (300, 16, 6, 16), (2000, 256, 6, 64),
                                (3, 8, 6, 16)):
            ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)])
            sid, eid, tot = moe_align_block_size(ids.to(torch.int32).to(DEVICE), bs, e,
                                                 ignore_invalid_experts=True)
            torch.cuda.synchronize()
            bad = check_moe_alignment(ids, e, bs, sid, eid, tot)
            runs.append({"m": m, "experts": e, "block": bs, "violations": bad[:5]})
        return {"ok": all(not r["violations"] for r in runs), "runs": runs, "seed": seed}
    raise KeyError(name)


def mxfp4_moe_weights(torch, g, e, k, n, form):
    """V4's MXFP4 experts as loaded: w13 [E, 2N, K/2] / w2 [E, K, N/2] e2m1 pairs (low nibble
    first), e8m0 scale bytes per 32 along K; vLLM's ``prepare_moe_mxfp4_layer_for_marlin``.
    ``form`` "mxfp4-swapped" (a control) loads w13's gate and up halves swapped. Returns
    (float64 weights as meant, prepared tensors)."""
    w13 = torch.randint(0, 256, (e, 2 * n, k // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (e, k, n // 2), dtype=torch.uint8, generator=g)
    # Scales that keep the intermediate values around the clamp (|x| ~ 1-30 at K 4096).
    s13 = torch.randint(118, 122, (e, 2 * n, k // 32), dtype=torch.uint8, generator=g)
    s2 = torch.randint(118, 122, (e, k, n // 32), dtype=torch.uint8, generator=g)
    w13_64, w2_64 = experts_float64("mxfp4", (w13, w2, s13, s2), k, n)
    l13, ls13 = w13, s13
    if form.endswith("swapped"):
        l13 = torch.cat([w13[:, n:], w13[:, :n]], 1)
        ls13 = torch.cat([s13[:, n:], s13[:, :n]], 1)
    return w13_64, w2_64, prepare_mxfp4_experts(torch, l13.to(DEVICE), w2.to(DEVICE),
                                                ls13.to(DEVICE), s2.to(DEVICE))


def prepare_mxfp4_experts(torch, w13, w2, s13, s2):
    """vLLM's ``prepare_moe_mxfp4_layer_for_marlin`` over loaded MXFP4 experts on the GPU
    (w13 [E, 2N, K/2], w2 [E, K, N/2] e2m1 pairs, e8m0 bytes per 32 along K): (q13, q2, q13s,
    q2s) as ``fused_marlin_moe`` takes them."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import (
        prepare_moe_mxfp4_layer_for_marlin,
    )

    layer = torch.nn.Module()
    layer.params_dtype = torch.bfloat16
    q13, q2, q13s, q2s, _, _ = prepare_moe_mxfp4_layer_for_marlin(layer, w13, w2, s13, s2,
                                                                  None, None)
    return q13, q2, q13s, q2s


def fp8_moe_weights(torch, g, e, k, n):
    """V4-Flash-Base's FP8 experts as loaded: w13 [E, 2N, K] / w2 [E, K, N] e4m3 codes, UE8M0
    scales per 128 x 128 block ([E, ceil(2N/128), K/128], [E, ceil(K/128), N/128]), vLLM's
    ``prepare_fp8_moe_layer_for_marlin``. Returns (float64 weights, prepared tensors)."""
    def one(rows, cols):
        codes = random_codes(g, e * rows, cols).view(e, rows, cols)
        exps = torch.randint(116, 120, (e, -(-rows // 128), cols // 128), dtype=torch.uint8,
                             generator=g)
        return codes, exps

    c13, x13 = one(2 * n, k)
    c2, x2 = one(k, n)
    w13_64, w2_64 = experts_float64("fp8", (c13, c2, x13, x2), k, n)
    return w13_64, w2_64, prepare_fp8_experts(torch, c13.to(DEVICE), c2.to(DEVICE),
                                              x13.to(DEVICE), x2.to(DEVICE))


def prepare_fp8_experts(torch, c13, c2, x13, x2):
    """vLLM's ``prepare_fp8_moe_layer_for_marlin`` over loaded FP8 experts on the GPU (e4m3
    codes w13 [E, 2N, K] / w2 [E, K, N] as uint8, UE8M0 exponent bytes per 128 x 128 block)."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp8 import (
        prepare_fp8_moe_layer_for_marlin,
    )

    e, k, n = c13.shape[0], c13.shape[2], c2.shape[2]
    layer = torch.nn.Module()
    layer.num_experts, layer.hidden_size, layer.intermediate_size_per_partition = e, k, n
    layer.weight_block_size, layer.orig_dtype = [128, 128], torch.bfloat16
    return prepare_fp8_moe_layer_for_marlin(
        layer, c13.view(torch.float8_e4m3fn), c2.view(torch.float8_e4m3fn),
        x13.view(torch.float8_e8m0fnu), x2.view(torch.float8_e8m0fnu))


def moe_case(torch, g, name):
    """V4's MXFP4 routed experts: w13 [E, 2N, K/2] and w2 [E, K, N/2] e2m1 pairs, e8m0 scales
    per 32 along K (w13: [E, 2N, K/32], w2: [E, K, N/32]); vLLM's
    ``prepare_moe_mxfp4_layer_for_marlin`` and ``fused_marlin_moe`` with SiLU and the swiglu
    clamp. Or V4-Flash-Base's FP8 experts (``fp8_moe_weights``)."""
    e, top_k, k, n, form = MOE_CASES[name]
    if form == "fp8-block":
        w13_64, w2_64, prepared = fp8_moe_weights(torch, g, e, k, n)
    else:
        w13_64, w2_64, prepared = mxfp4_moe_weights(torch, g, e, k, n, form)
    apply = marlin_experts(prepared, "fp8" if form == "fp8-block" else "mxfp4")

    def reference(x64, topk_w, topk_ids):
        return moe_float64(x64, topk_w, topk_ids, w13_64, w2_64)

    return apply, reference


def marlin_experts(prepared, weights: str):
    """``(x, topk_w, topk_ids) -> y``: vLLM's ``fused_marlin_moe`` over prepared experts
    (``prepare_*_experts``; ``weights`` "mxfp4" or "fp8") with SiLU and V4's swiglu clamp."""
    from vllm.model_executor.layers.fused_moe.activation import (
        ApplyMoEActivationConfig,
        MoEActivation,
    )
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    from vllm.scalar_type import scalar_types

    q13, q2, q13s, q2s = prepared
    quant_type = {"fp8": scalar_types.float8_e4m3fn, "mxfp4": scalar_types.float4_e2m1f}[weights]
    config = ApplyMoEActivationConfig(clamp_limit=SWIGLU_LIMIT)

    def apply(x, topk_w, topk_ids):
        return fused_marlin_moe(x, q13, q2, None, None, q13s, q2s, topk_w, topk_ids,
                                quant_type_id=quant_type.id,
                                activation=MoEActivation.SILU, activation_config=config)

    return apply


def _prepared(torch, build):
    """``build()`` with bf16 as the default dtype, as vLLM's loader runs
    process_weights_after_loading."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return build()
    finally:
        torch.set_default_dtype(prev)


def _measure(torch, m: int, y, ref) -> dict:
    """One token count's output against its float64 reference."""
    torch.cuda.synchronize()
    out = y.double().cpu()
    return {"m": m, "shape": list(y.shape), "dtype": str(y.dtype),
            "rel_err": float((out - ref).norm() / ref.norm()),
            "max_abs_err": float((out - ref).abs().max()),
            "finite": bool(torch.isfinite(out).all())}


def _verdict(runs: list, width: int, seed: int) -> dict:
    ok = all(r["rel_err"] <= REL_TOL and r["finite"] and r["shape"] == [r["m"], width]
             and r["dtype"] == "torch.bfloat16" for r in runs)
    return {"ok": bool(ok), "runs": runs, "seed": seed}


def run_moe_case(torch, name: str, g, seed: int) -> dict:
    e, top_k, k, _, _ = MOE_CASES[name]
    apply, reference = _prepared(torch, lambda: moe_case(torch, g, name))
    runs = []
    for m in TOKENS:
        x = (torch.randn((m, k), generator=g, dtype=torch.float64) * 0.5).to(torch.bfloat16)
        topk_ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)])
        topk_w = torch.softmax(torch.randn((m, top_k), generator=g), -1).float()
        y = apply(x.to(DEVICE), topk_w.to(DEVICE), topk_ids.to(torch.int32).to(DEVICE))
        runs.append(_measure(torch, m, y, reference(x.double(), topk_w, topk_ids)))
    return _verdict(runs, k, seed)


def run_linear_case(torch, name: str, g, seed: int) -> dict:
    fmt, n, k, form = CASES[name]
    w64, apply = _prepared(
        torch, lambda: (block_case if fmt == "block" else mx_case)(torch, g, n, k, form))
    runs = []
    for m in TOKENS:
        x = torch.randn((m, k), generator=g, dtype=torch.float64).to(torch.bfloat16)
        runs.append(_measure(torch, m, apply(x.to(DEVICE)), x.double() @ w64.T))
    return _verdict(runs, n, seed)


def run_case(name: str) -> dict:
    import torch

    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    run = (run_moe_case if name in MOE_CASES else run_op_case if name in OP_CASES
           else run_linear_case)
    return run(torch, name, torch.Generator().manual_seed(seed), seed)


def main(argv=None) -> int:
    ap = checks.arg_parser(__doc__)
    ap.add_argument("--device", default="cuda", choices=("cuda",))
    ap.add_argument("--limits", default="a100", choices=sorted(vllm_c_marlin.LIMITS),
                    help="the SM count and opt-in shared memory the host code sees")
    args = ap.parse_args(argv)
    import torch

    lib, _ = install_ops(args.tree, vllm_c_marlin.LIMITS[args.limits])
    checks.boot(args.tree, args.overlay, args.capability, (), device=args.device)
    print("INFO " + repr({"limits": list(lib.limits), "device": torch.cuda.get_device_name(0)}))
    return checks.run_cases(args.case or list(CASES), run_case)


def install_ops(tree: Path, limits: tuple[int, int]):
    """Build the tree's Marlin libraries (dense and MoE) and the two small ops
    ``fused_marlin_moe`` also calls as SM80 code, and register them as vLLM's ``_C`` /
    ``_moe_C`` ops with the tree's schemas; the host code is told ``limits`` (SM count, opt-in
    shared memory). Returns (dense library, MoE library)."""
    lib = vllm_c_marlin.MarlinLib(vllm_c_marlin.build(tree), limits)
    vllm_c_marlin.register_vllm_ops(lib, tree)
    moe = vllm_c_marlin.MarlinMoeLib(vllm_c_marlin.build(tree, family="moe"), limits)
    vllm_c_marlin.register_vllm_ops(moe, tree)
    # The two small compiled ops fused_marlin_moe also calls, built from the tree the same
    # way (tests/vllm_c_ops.py, sources "moe_align" and "silu_clamp").
    vllm_c_marlin.define(tree, "_moe_C", "csrc/moe/torch_bindings.cpp", {
        "moe_align_block_size": vllm_c_ops.load("sm80", "moe_align").moe_align_block_size})
    vllm_c_marlin.define(tree, "_C", "csrc/torch_bindings.cpp", {
        "silu_and_mul_with_clamp":
            vllm_c_ops.load("sm80", "silu_clamp").silu_and_mul_with_clamp})
    return lib, moe


if __name__ == "__main__":
    sys.exit(main())
