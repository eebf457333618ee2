"""DeepSeek-V4.1's FP8 Triton kernels with the software e4m3 codec (patch 7, what SM80/SM86
run) against the same kernels with the hardware conversion (what SM89+ runs), on the same
fresh random inputs, bit for bit: the compressed-cache insert of the 584-byte record, the
indexer-K store (FP8 cache) and the Engram lookup (dequantising and packed).

The kernels are imported from the applied tree (``bench/upstream_import.py``). The
launchers pick the software codec below 9.0 through ``software_e4m3_encoder`` /
``software_e4m3_decoder``; here, on an SM89+ GPU, the test swaps those in explicitly, so
both paths run on one device. Skips with the reason when the tree or an SM89+ GPU is
missing (on Ampere only the software path exists; ``tests/test_fp8_reference.py`` checks
the codec itself over all 256 codes on the CPU).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO / "bench") not in sys.path:
    sys.path.insert(0, str(_REPO / "bench"))

OPS = "vllm.models.deepseek_v41.common.ops."


def _import(module: str):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the hardware FP8 conversion these are compared with needs SM89+")
    import upstream_import

    try:
        return upstream_import.import_upstream(module)
    except upstream_import.UpstreamImportError as e:
        pytest.skip(f"{module} not importable from the applied tree: {e}")


def _indexer_k_store():
    """``indexer_k_store``, whose ``from . import`` reads two names the package's
    ``__init__`` re-exports from V4's ``fused_indexer_q``. upstream_import registers the
    package as an empty shell (its ``__init__`` would import every V4.1 op), so the shell
    gets those two names first."""
    fiq = _import("vllm.models.deepseek_v4.common.ops.fused_indexer_q")
    import upstream_import

    parts = (OPS + "indexer_k_store").split(".")
    upstream_import.prepare(shells=tuple(".".join(parts[:i]) for i in range(1, len(parts))))
    pkg = sys.modules[OPS[:-1]]
    if getattr(pkg, "__file__", None) is None:
        pkg.MXFP4_BLOCK_SIZE = fiq.MXFP4_BLOCK_SIZE
        pkg._fp32x2_to_fp4x2 = fiq._fp32x2_to_fp4x2
    return _import(OPS + "indexer_k_store")


def _engram_kernel(tmp_path):
    """The tree's ``_engram_lookup_kernel``, loaded on its own: ``engram.py`` imports
    vLLM's config and model layers (pydantic, transformers, ...), which the GPU bundle
    does not carry. Its source is cut from the file and imported as a module with the
    three names it uses; the launcher's choices (uint8 view, decoder) are checked on the
    CPU (tests/test_dispatch_sm80.py, probe ``v41_fp8_launch``)."""
    import ast
    import importlib.util

    import upstream_import

    _import(OPS + "software_fp8")
    path = upstream_import.find_tree() / "vllm/models/deepseek_v41/common/engram.py"
    text = path.read_text()
    fn = next(n for n in ast.parse(text).body
              if isinstance(n, ast.FunctionDef) and n.name == "_engram_lookup_kernel")
    lines = text.splitlines()[fn.decorator_list[0].lineno - 1: fn.end_lineno]
    src = tmp_path / "engram_lookup_kernel.py"
    src.write_text(
        "from vllm.triton_utils import tl, triton\n"
        "from vllm.models.deepseek_v41.common.ops.software_fp8 import e4m3_to_float32\n"
        "_SORTED_IS_CONSTEXPR = tl.constexpr(False)  # engram.py's value on CUDA\n\n"
        + "\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location("engram_lookup_kernel", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._engram_lookup_kernel


@pytest.fixture(scope="module")
def codec():
    from deepinfer_sm80.triton_writers import fp8

    return fp8


def _both(monkeypatch, module, name: str, fn, run):
    """run() with the launcher's codec choice as on 9.0+ (None) and as below 9.0 (fn)."""
    outs = []
    for choice in (None, fn):
        monkeypatch.setattr(module, name, lambda c=choice: c)
        outs.append(run())
    torch.cuda.synchronize()
    return outs


def _latent(g: torch.Generator, t: int, width: int) -> torch.Tensor:
    """bf16 rows whose 64-wide groups span many scales, with zeros, tiny and large values."""
    x = torch.randn(t, width, device="cuda", generator=g)
    x *= torch.exp2(torch.randint(-20, 12, (t, width // 64, 1), device="cuda",
                                  generator=g).float()).repeat_interleave(64, 1).view(t, width)
    x[:, :7] = 0.0
    x[1::5, 64:128] *= 1e-6
    return x.to(torch.bfloat16)


def _gen() -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(int(torch.randint(0, 2**31 - 1, (1,)).item()))
    return g


def _store_inputs(g: torch.Generator, width: int, block: int, record: int):
    """1000 rows of ``width`` values at random positions, their slots in 40 pages of
    ``block`` records (every ninth -1), a cos/sin cache, and random cache bytes."""
    t, nb = 1000, 40
    rows = _latent(g, t, width)
    positions = torch.randint(0, 8192, (t,), device="cuda", generator=g)
    cos_sin = torch.randn(8192, 64, device="cuda", generator=g)
    slots = torch.randperm(nb * block, device="cuda", generator=g)[:t]
    slots[::9] = -1
    cache0 = torch.randint(0, 256, (nb, block, record), dtype=torch.uint8, device="cuda",
                           generator=g)
    return rows, positions, cos_sin, slots, cache0


def _assert_same_bytes(hw: torch.Tensor, sw: torch.Tensor, before: torch.Tensor) -> None:
    assert not torch.equal(hw, before)  # the kernel wrote
    diff = (hw != sw).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at {diff[:4].tolist()}"


@pytest.mark.parametrize("ratio", [1, 2])
def test_compressed_insert_584_software_equals_hardware(monkeypatch, codec, ratio):
    # it imports V4's fused_indexer_q: import that first, so that V4's packages are
    # registered as shells (their __init__ would import the whole V4 model)
    _import("vllm.models.deepseek_v4.common.ops.fused_indexer_q")
    fcq = _import(OPS + "fused_compress_quant_cache")
    latent, positions, cos_sin, slots, cache0 = _store_inputs(_gen(), 512, 128 // ratio, 584)

    def run():
        cache = cache0.clone()
        fcq.rope_quant_insert(latent, positions, cos_sin, cache, slots, ratio)
        return cache

    hw, sw = _both(monkeypatch, fcq, "software_e4m3_encoder", codec.e4m3_encode, run)
    _assert_same_bytes(hw, sw, cache0)


@pytest.mark.parametrize("ratio", [1, 2])
def test_indexer_k_store_software_equals_hardware(monkeypatch, codec, ratio):
    iks = _indexer_k_store()
    g = _gen()
    k_pre, positions, cos_sin, slots, cache0 = _store_inputs(g, 128, 64, 132)
    weight = (1 + 0.1 * torch.randn(128, device="cuda", generator=g)).to(torch.bfloat16)

    def run():
        cache = cache0.clone()
        iks.indexer_k_norm_rope_store(k_pre, positions, cos_sin, weight, 1e-6, cache, slots,
                                      ratio, use_fp4_cache=False)
        return cache

    hw, sw = _both(monkeypatch, iks, "software_e4m3_encoder", codec.e4m3_encode, run)
    _assert_same_bytes(hw, sw, cache0)


@pytest.mark.parametrize("packed", [False, True])
def test_engram_lookup_software_equals_hardware(codec, tmp_path, packed):
    kernel = _engram_kernel(tmp_path)
    g = _gen()
    rows, dim, heads, tokens = 4096, 256, 8, 777
    codes = torch.randint(0, 256, (rows, dim), dtype=torch.uint8, device="cuda", generator=g)
    codes[:1, :] = torch.arange(256, dtype=torch.uint8, device="cuda")  # every code
    scales = torch.randint(100, 150, (rows, dim // 32), dtype=torch.uint8, device="cuda",
                           generator=g)
    ids = torch.randint(-50, rows + 50, (tokens, heads), device="cuda", generator=g)
    ids[0, :] = 0
    n = tokens * heads
    grid = min(-(-n // 16), torch.cuda.get_device_properties(0).multi_processor_count)

    def run(weight, extra):
        if packed:
            out = torch.full((tokens, heads * (dim + dim // 32)), 0x5A, dtype=torch.uint8,
                             device="cuda")
        else:
            out = torch.full((n, dim), float("nan"), dtype=torch.bfloat16, device="cuda")
        # the arguments of ParallelEngramEmbedding.lookup (unsorted, no peers)
        kernel[(grid,)](weight, scales, ids, ids, out, 0, rows, n, ids.stride(0),
                        ids.stride(1), HEAD_START=0, LOCAL_HEADS=heads, TOTAL_HEADS=heads,
                        DIM=dim, QUANT_BLOCK=32, BLOCK_R=16, GRID=grid, SORTED=False,
                        PACKED=packed, OUT_STRIDE=out.stride(0), PEER_ROWS=0, **extra)
        return out.view(torch.uint8)

    hw = run(codes.view(torch.float8_e4m3fn), {})
    sw = run(codes, {"FP8_DECODE": codec.e4m3_decode})  # what the launcher passes below 9.0
    torch.cuda.synchronize()
    assert torch.equal(hw, sw)
    if not packed:  # token 0 reads the row of every code: written, not poison
        assert not torch.isnan(hw.view(torch.bfloat16)[:heads].float()).all()
        assert (hw.view(torch.bfloat16)[:heads].float() != 0).any()
