"""Error budget of bf16 sparse MLA attention against an fp32 computation (CPU, float64 model).

Issue 6 asks for a relative Frobenius error of at most 2e-3 against "an fp32 computation from
the same bf16/FP8 inputs". This script separates what any kernel with a bf16 output pays from
what the FlashMLA numerics (P rounded to bf16 before the PV MMA, as our kernels do) add, on
the benchmark's input distribution (unit-normal bf16 Q and keys, 640 keys, 64 heads, scale
512^-0.5, a unit-normal sink). Everything is computed in float64, which stands in for the fp32
reference (its own rounding is far below these numbers):

  out-round      the exact output rounded to bf16 (the floor of every bf16-output kernel)
  P-bf16         P rounded to bf16 (normaliser = sum of the rounded weights), output exact
  P-bf16 + out   both: what our kernels compute
  ... vs bf16 ref  the same, against the exact output rounded to bf16 (the tests' comparison)
  P-fp16 + out   P rounded to fp16 instead (what a half-precision PV MMA would pay)

Usage: python bench/precision_budget.py [--trials N] [--heads H] [--keys N] [--seed S]
"""

from __future__ import annotations

import argparse

import torch


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float64)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def budget(heads: int, keys: int, gen: torch.Generator) -> dict[str, float]:
    dim = 512
    q = _bf16(torch.randn(heads, dim, dtype=torch.float64, generator=gen))
    kv = _bf16(torch.randn(keys, dim, dtype=torch.float64, generator=gen))
    sink = torch.randn(heads, 1, dtype=torch.float64, generator=gen)
    s = (q @ kv.T) * dim ** -0.5
    m = s.max(dim=1, keepdim=True).values
    p = torch.exp(s - m)
    sink_w = torch.exp(sink - m)
    exact = (p @ kv) / (p.sum(1, keepdim=True) + sink_w)

    def with_p(pr: torch.Tensor) -> torch.Tensor:
        return (pr @ kv) / (pr.sum(1, keepdim=True) + sink_w)

    o_bf16p = with_p(_bf16(p))
    o_fp16p = with_p(p.to(torch.float16).to(torch.float64))
    return {
        "out-round": _rel(_bf16(exact), exact),
        "P-bf16": _rel(o_bf16p, exact),
        "P-bf16 + out": _rel(_bf16(o_bf16p), exact),
        "P-bf16 + out vs bf16 ref": _rel(_bf16(o_bf16p), _bf16(exact)),
        "P-fp16 + out": _rel(_bf16(o_fp16p), exact),
        "P-fp16 + out vs bf16 ref": _rel(_bf16(o_fp16p), _bf16(exact)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--keys", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    rows = [budget(args.heads, args.keys, gen) for _ in range(args.trials)]
    print(f"relative Frobenius error, {args.heads} heads x {args.keys} keys, {args.trials} trials "
          f"(seed {args.seed}): min / max")
    for name in rows[0]:
        vals = [r[name] for r in rows]
        print(f"  {name:26s} {min(vals):.2e} / {max(vals):.2e}")


if __name__ == "__main__":
    main()
