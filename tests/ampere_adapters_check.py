"""Checks of the vLLM-facing Ampere adapters against a vLLM source tree (run
in a subprocess by tests/test_ampere_adapters.py, with the tree first on
sys.path and TRITON_INTERPRET=1).  The overlay modules are loaded from
overlay/vllm/... under their vLLM module names.  Prints one JSON line."""

import importlib.util
import json
import os
import sys
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(1, os.path.join(ROOT, "overlay"))
sys.path.insert(1, HERE)

import torch  # noqa: E402

NV = "vllm.models.deepseek_v4.nvidia"


def load_overlay(name):
    mod_name = f"{NV}.{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    path = os.path.join(ROOT, "overlay", "vllm", "models", "deepseek_v4", "nvidia", f"{name}.py")
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    res = {}
    import vllm.models.deepseek_v4.nvidia as nv_pkg  # noqa: F401  (the tree's package)

    load_overlay("ampere_ops")
    load_overlay("ampere_indexer")
    sp = load_overlay("ampere_sparse")
    ops = sys.modules[f"{NV}.ampere_ops"]
    A = sp.DeepseekV4AmpereSparseAttention

    res["padded_heads"] = {n: A.get_padded_num_q_heads(n) for n in (1, 8, 9, 16, 33, 64, 65, 128)}
    try:
        A.get_padded_num_q_heads(129)
        res["padded_129_raises"] = False
    except ValueError:
        res["padded_129_raises"] = True

    from vllm.platforms.interface import DeviceCapability

    be = sp.DeepseekV4AmpereSparseMLABackend
    res["backend_caps"] = {f"{m}.{n}": be.supports_compute_capability(DeviceCapability(m, n))
                           for m, n in ((8, 0), (8, 6), (9, 0), (10, 0), (12, 0))}
    res["swa_builder"] = sp.DeepseekSparseSWAAmpereBackend.get_builder_cls().__name__
    b = object.__new__(sp.DeepseekSparseSWAAmpereMetadataBuilder)
    sched = b.build_tile_scheduler(7)
    res["tile_scheduler_all_none"] = bool(sched) and all(v is None for v in sched.values())
    res["tile_scheduler_keys"] = sorted(sched)
    res["indexer_cls"] = A._get_indexer_cls(None, None).__name__

    # o_proj: wo_a captured (dequantised) before a "repack" that destroys it.
    g = torch.Generator().manual_seed(0)
    G, R, hpg, D = 2, 256, 2, 512
    w_full = torch.randn(G * R, hpg * D, generator=g) * 0.05
    blocks = w_full.view(G * R // 128, 128, hpg * D // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3)) / 448.0
    wq = (blocks / scale[:, None, :, None]).view(G * R, hpg * D).to(torch.float8_e4m3fn)
    wo_a = torch.nn.Module()
    wo_a.weight = torch.nn.Parameter(wq, requires_grad=False)
    wo_a.weight_scale_inv = torch.nn.Parameter(scale, requires_grad=False)
    wo_a.weight_block_size = [128, 128]

    class Repacking:
        def process_weights_after_loading(self, layer):
            layer.weight = torch.nn.Parameter(
                torch.randint(-2**30, 2**30, (G * R // 2, hpg * D // 4), dtype=torch.int32),
                requires_grad=False)

    wo_a.quant_method = Repacking()
    class FakeLayer(ops.AmpereOProjMixin):
        pass

    layer = FakeLayer()
    layer.wo_a, layer.n_local_groups, layer.o_lora_rank, layer.nope_head_dim = wo_a, G, R, 448
    layer.rotary_emb = SimpleNamespace(cos_sin_cache=torch.randn(1000, 64, generator=g))
    wo_b = (torch.randn(128, G * R, generator=g) * 0.05).to(torch.bfloat16)
    layer.wo_b = lambda z: z @ wo_b.t()
    layer._init_ampere_o_proj()
    wo_a.quant_method.process_weights_after_loading(wo_a)
    want = (wq.float().view_as(blocks) * scale[:, None, :, None]).view(G, R, hpg * D)
    res["wo_a_captured_exact"] = bool(torch.equal(layer._wo_a_grouped.float(),
                                                  want.to(torch.bfloat16).float()))
    res["repacked_weight_freed"] = wo_a.weight.numel() == 0
    o = torch.randn(5, G * hpg, D, generator=g).to(torch.bfloat16)
    pos = torch.randint(0, 1000, (5,), generator=g)
    out = layer._o_proj(o, pos)
    from deepinfer_sm80.ampere.o_proj import o_proj_reference64

    ref = o_proj_reference64(o, pos, layer.rotary_emb.cos_sin_cache, layer._wo_a_grouped, wo_b)
    res["o_proj_rel_err"] = float((out.double() - ref).norm() / ref.norm())

    # Compressor store through the SM80 writer (Triton interpreter on CPU).
    from deepinfer_sm80.reference import writers as R_
    from writer_cases import compare_fp8_bytes, make_compressor_case

    for ratio in (4, 128):
        case = make_compressor_case(ratio, 512, [3, 40, 300] if ratio == 4 else [256, 130],
                                    seed=ratio)
        a = case.args
        want_bytes, _ = R_.compressor_store_ref(**a)
        comp = object.__new__(ops.AmpereCompressor)
        torch.nn.Module.__init__(comp)
        comp.k_cache_prefix = "layer.attn"
        comp._static_forward_context = {"layer.attn": SimpleNamespace(kv_cache=a["kv_cache"])}
        comp.use_fp4_cache = False
        comp.head_dim, comp.rope_head_dim = 512, 64
        comp.compress_ratio, comp.overlap = ratio, ratio == 4
        comp.norm = SimpleNamespace(weight=a["rms_norm_weight"])
        comp.rms_norm_eps = a["rms_norm_eps"]
        comp._quant_block, comp._token_stride, comp._scale_dim = 64, 576, 8
        smd = SimpleNamespace(slot_mapping=a["slot_mapping"],
                              token_to_req_indices=a["token_to_req_indices"],
                              block_table=a["block_table"], block_size=a["block_size"])
        comp._compress_norm_rope_store(
            smd, a["state_cache"], case.state_width, a["positions"],
            SimpleNamespace(cos_sin_cache=a["cos_sin_cache"]),
            {"layer.attn": SimpleNamespace(slot_mapping=a["kv_slot_mapping"])}, {})
        res[f"compressor_c{ratio}"] = compare_fp8_bytes(case.raw, want_bytes, case)
    res["indexer_decode_adapter"] = check_indexer_decode_adapter()
    res["indexer_profile"] = check_indexer_profile_reservation()
    print("RESULT " + json.dumps(res))


def check_indexer_decode_adapter():
    """AmpereSparseAttnIndexer on a uniform decode batch (3 requests x 2
    tokens) with vLLM-shaped metadata: the top-k buffer rows equal the
    float64 oracle's sets; rows beyond the batch are reset to -1."""
    from deepinfer_sm80.ampere import indexer as I
    from indexer_cases import dyadic_fp8, dyadic_weights, k_scales, logits64

    mi = sys.modules[f"{NV}.ampere_indexer"]
    g = torch.Generator().manual_seed(3)
    B, NN, H, D, bs, nb, K = 3, 2, 64, 128, 64, 8, 64
    codes, vals = dyadic_fp8((nb, bs, D), g)
    sc = k_scales(nb * bs, g).view(nb, bs)
    raw = torch.zeros(nb, bs * 132, dtype=torch.uint8)
    raw[:, : bs * D] = codes.view(nb, -1)
    raw[:, bs * D:] = sc.float().contiguous().view(torch.uint8).view(nb, -1)
    pages = raw.view(nb, bs, 132)
    bt = torch.tensor([[3, 1], [0, 5], [7, 2]], dtype=torch.int32)
    seq = torch.tensor([[90, 91], [30, 31], [127, 128]], dtype=torch.int32)  # compressed
    q, q64 = dyadic_fp8((B * NN, H, D), g)
    w64 = dyadic_weights((B * NN, H), g)
    buf = torch.full((B * NN + 2, K), 7, dtype=torch.int32)
    op = object.__new__(mi.AmpereSparseAttnIndexer)
    torch.nn.Module.__init__(op)
    op.k_cache = SimpleNamespace(prefix="l.indexer.k_cache", kv_cache=pages)
    op.topk_indices_buffer, op.topk_tokens, op.head_dim = buf, K, D
    op.max_total_seq_len = 1024
    md = SimpleNamespace(num_prefills=0, num_decodes=B, num_decode_tokens=B * NN, prefill=None,
                         decode=SimpleNamespace(decode_lens=torch.full((B,), NN), seq_lens=seq,
                                                requires_padding=False, block_table=bt))
    mi.get_forward_context = lambda: SimpleNamespace(attn_metadata={"l.indexer.k_cache": md})
    op._forward(torch.zeros(B * NN + 2, 16), q.view(torch.float8_e4m3fn), None,
                w64.float())
    ok = bool((buf[B * NN:] == -1).all())
    for b in range(B):
        kv = torch.cat([vals[int(p)] for p in bt[b]])
        ks = torch.cat([sc[int(p)] for p in bt[b]])
        L = logits64(q64[b * NN:(b + 1) * NN], w64[b * NN:(b + 1) * NN], kv, ks)
        valid = torch.arange(kv.shape[0]).unsqueeze(0) < seq[b].unsqueeze(1)
        want = I.reference_topk_sets(L, valid, K)
        for i in range(NN):
            ok &= {j for j in buf[b * NN + i].tolist() if j >= 0} == want[i]
    return ok


def check_indexer_profile_reservation():
    """The profile run (no attention metadata) of AmpereSparseAttnIndexer: it reserves vLLM's
    gather workspace and allocates one dummy of ``profile_scratch_bytes`` (what a prefill of
    the profile's tokens or an eager decode of ``max_decode_rows`` takes,
    ``deepinfer_sm80.ampere.indexer_memory``), for V4 and for V4.1's candidate layers, with a
    1M-token context (262,144 compressed positions at ratio 4)."""
    from deepinfer_sm80.ampere import indexer_memory as IM

    mi = sys.modules[f"{NV}.ampere_indexer"]
    tokens, H, D, topk, cbs, cand_k = 8192, 64, 128, 512, 8, 2048
    cols = (1 << 20) // 4
    requested, allocated = [], []

    class Workspace:
        def get_simultaneous(self, *specs):
            requested.append([list(shape) for shape, _ in specs])

    real_empty = torch.empty

    def empty(*size, **kw):  # records the 1-D byte dummies, allocates nothing for them
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        if kw.get("dtype") == torch.uint8 and len(shape) == 1 and not kw.get("out"):
            allocated.append(int(shape[0]))
            return real_empty(0, dtype=torch.uint8)
        return real_empty(*size, **kw)

    def run(candidates, max_decode_rows):
        op = object.__new__(mi.AmpereSparseAttnIndexer)
        torch.nn.Module.__init__(op)
        op.k_cache = SimpleNamespace(prefix="l.indexer.k_cache", kv_cache=torch.tensor([]),
                                     cache_config=SimpleNamespace(block_size=256))
        op.compress_ratio, op.topk_tokens, op.head_dim = 4, topk, D
        op.max_model_len, op.max_total_seq_len = cols, 5 * 8 * cols
        op.topk_indices_buffer = real_empty((tokens, topk), dtype=torch.int32)
        op.max_decode_rows = max_decode_rows
        if candidates:
            op.candidate_blocks = real_empty((tokens, cand_k), dtype=torch.int32)
            op.candidate_block_size, op.candidate_write = cbs, candidates == "write"
        requested.clear()
        allocated.clear()
        saved = mi.get_forward_context, mi.current_workspace_manager
        mi.get_forward_context = lambda: SimpleNamespace(attn_metadata=None)
        mi.current_workspace_manager = lambda: Workspace()
        torch.empty = empty
        try:
            got = op._forward(real_empty((tokens, 16)), real_empty((tokens, H, D)), None,
                              real_empty((tokens, H)))
        finally:
            torch.empty = real_empty
            mi.get_forward_context, mi.current_workspace_manager = saved
        return op, got, list(requested), list(allocated)

    out = {}
    for candidates in (None, "write", "mask"):
        for rows in (256 * 6, 0):
            op, got, req, alloc = run(candidates, rows)
            cand = {} if not candidates else dict(candidate_k=cand_k, candidate_block_size=cbs,
                                                  candidate_write=candidates == "write")
            dec_rows = rows or tokens
            out[f"{candidates}/{rows}"] = {
                "returns_buffer": got is op.topk_indices_buffer,
                "workspace": req,
                "dummies": alloc,
                "prefill_bound": IM.prefill_scratch_bytes(
                    tokens, H, op.max_total_seq_len, topk, sm_count=0, row_columns=cols, **cand),
                "decode_bound": IM.decode_scratch_bytes(dec_rows, H, cols, 64, topk, sm_count=0,
                                                        **cand),
            }
    return out


if __name__ == "__main__":
    main()
