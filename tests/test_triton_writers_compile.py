"""Every Triton kernel the SM80 path ships (writers, indexer) compiles ahead of
time for cuda 80 and 86 on a CPU machine, without any FP8 conversion
instruction (software e4m3 only) and within SM86's 99 KB shared memory."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "overlay"))
triton = pytest.importorskip("triton", reason="triton is not installed (make venv-torch installs it)")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from deepinfer_sm80.triton_writers import compressor_store, indexer_q, indexer_store  # noqa: E402

SMEM_SM86 = 99 * 1024

_STORE_SIG = {
    "state_ptr": "*fp32", "state_stride0": "i64", "state_stride1": "i64",
    "t2r_ptr": "*i32", "pos_ptr": "*i64", "n_pos": "i32", "slot_ptr": "*i64",
    "bt_ptr": "*i32", "bt_stride": "i64", "state_block_size": "i32",
    "w_ptr": "*bf16", "eps": "fp32", "cs_ptr": "*fp32", "cs_stride": "i64",
    "k_ptr": "*u8", "kv_slot_ptr": "*i64", "n_kv_slots": "i32",
    "kv_block_size": "i32", "kv_block_stride": "i64",
}


def _main_store(kernel, ratio):
    sig = dict(_STORE_SIG)
    sig = {k: v for k, v in sig.items()}
    order = ["state_ptr", "state_stride0", "state_stride1", "t2r_ptr", "n_req_idx", "pos_ptr",
             "n_pos", "slot_ptr", "bt_ptr", "bt_stride", "state_block_size", "w_ptr", "eps",
             "cs_ptr", "cs_stride", "k_ptr", "kv_slot_ptr", "n_kv_slots", "kv_block_size",
             "kv_block_stride"]
    sig["n_req_idx"] = "i32"
    consts = dict(HEAD=512, STATE_WIDTH=1024 if ratio == 4 else 512, COMPRESS_RATIO=ratio,
                  ROPE=64, QB=64, TOKEN_STRIDE=576, SCALE_DIM=8)
    full = {k: sig[k] for k in order}
    full.update({k: "constexpr" for k in consts})
    return ASTSource(fn=kernel, signature=full, constexprs=consts)


def _c128_two_stage():
    sig1 = {k: _STORE_SIG.get(k, "i32") for k in [
        "state_ptr", "state_stride0", "state_stride1", "t2r_ptr", "n_req_idx", "pos_ptr", "n_pos",
        "slot_ptr", "bt_ptr", "bt_stride", "state_block_size", "kv_slot_ptr", "n_kv_slots"]}
    sig1["scratch_ptr"] = "*fp32"
    c1 = dict(HEAD=512, STATE_WIDTH=512, COMPRESS_RATIO=128, HEAD_TILE=64)
    sig1.update({k: "constexpr" for k in c1})
    sig2 = {"scratch_ptr": "*fp32"}
    sig2.update({k: _STORE_SIG.get(k, "i32") for k in [
        "t2r_ptr", "n_req_idx", "pos_ptr", "n_pos", "slot_ptr", "w_ptr", "eps", "cs_ptr",
        "cs_stride", "k_ptr", "kv_slot_ptr", "n_kv_slots", "kv_block_size", "kv_block_stride"]})
    c2 = dict(HEAD=512, COMPRESS_RATIO=128, ROPE=64, QB=64, TOKEN_STRIDE=576, SCALE_DIM=8)
    sig2.update({k: "constexpr" for k in c2})
    return {
        "c128_compress": (ASTSource(fn=compressor_store._c128_compress_kernel, signature=sig1,
                                    constexprs=c1), 4),
        "c128_store": (ASTSource(fn=compressor_store._c128_store_kernel, signature=sig2,
                                 constexprs=c2), 8),
    }


def _indexer_store():
    order = ["state_ptr", "state_stride0", "state_stride1", "t2r_ptr", "pos_ptr", "n_pos",
             "slot_ptr", "bt_ptr", "bt_stride", "state_block_size", "w_ptr", "eps", "cs_ptr",
             "cs_stride", "k_ptr", "kv_slot_ptr", "n_kv_slots", "kv_block_size",
             "kv_block_stride"]
    consts = dict(HEAD=128, STATE_WIDTH=256, COMPRESS_RATIO=4, OVERLAP=True, ROPE=64)
    full = {k: _STORE_SIG[k] for k in order}
    full.update({k: "constexpr" for k in consts})
    return ASTSource(fn=indexer_store._indexer_compress_store_kernel, signature=full,
                     constexprs=consts)


def _index_q():
    sig = {"pos_ptr": "*i64", "q_ptr": "*bf16", "q_stride0": "i64", "q_stride1": "i64",
           "cs_ptr": "*fp32", "cs_stride": "i64", "out_ptr": "*u8", "out_stride0": "i64",
           "out_stride1": "i64", "w_ptr": "*bf16", "w_stride": "i64", "w_out_ptr": "*fp32",
           "w_out_stride": "i64", "softmax_scale": "fp32", "head_scale": "fp32",
           "HEAD_DIM": "constexpr", "HALF_ROT": "constexpr"}
    return ASTSource(fn=indexer_q._indexer_q_rope_quant_kernel, signature=sig,
                     constexprs={"HEAD_DIM": 128, "HALF_ROT": 32})


def _sources():
    out = {
        "c4_store": (_main_store(compressor_store._c4_compress_store_kernel, 4), 4),
        "indexer_store": (_indexer_store(), 4),
        "index_q": (_index_q(), 1),
    }
    out.update(_c128_two_stage())
    from deepinfer_sm80.ampere import o_proj

    inv = o_proj._triton_inverse_rope()
    sig = {"o_ptr": "*bf16", "o_s0": "i64", "o_s1": "i64", "pos_ptr": "*i64", "cs_ptr": "*fp32",
           "cs_s0": "i64", "out_ptr": "*bf16", "out_s0": "i64", "H": "i32",
           "D": "constexpr", "NOPE": "constexpr", "HALF": "constexpr"}
    out["inverse_rope"] = (ASTSource(fn=inv, signature=sig,
                                     constexprs={"D": 512, "NOPE": 448, "HALF": 32}), 4)
    try:
        from deepinfer_sm80.ampere import indexer_triton
    except ImportError:
        return out
    out.update(indexer_triton.aot_sources())
    return out


SOURCES = _sources()


@pytest.mark.parametrize("cap", [80, 86])
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_compiles_for_ampere(name, cap):
    src, num_warps = SOURCES[name]
    compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32),
                              options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    assert f".target sm_{cap}" in ptx
    assert len(compiled.asm["cubin"]) > 0
    assert "e4m3" not in ptx and "e5m2" not in ptx, "hardware FP8 conversion on SM80 path"
    assert compiled.metadata.shared <= SMEM_SM86
