"""Shared GPU benchmark harness (used by bench_cache.py and the attention benchmarks).

- ``copy_bandwidth``: device-to-device copy bandwidth measured in the run, counting bytes
  read plus bytes written (the ceiling that bandwidth-bound kernels are judged against);
- ``graph_time``: per-call time from CUDA-graph replay: each input set's call is captured
  into one graph (cycling through the sets), the graph is replayed after a warm-up, each
  replay timed with CUDA events; the median replay time over the calls per replay is the
  figure; min and interquartile spread are kept to judge noise;
- ``rotation_count`` / ``fresh_seed``: several fresh random input sets, together larger
  than twice the L2 cache where the working set matters, so a replay does not time L2;
- ``Report``: JSON in ``bench/results/`` and a markdown section in ``docs/benchmarks.md``
  recording GPU, SM count, date, exact command, versions and the copy bandwidth.

Imports only torch (and triton for its version string, if present).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
BENCH_DOC = REPO / "docs" / "benchmarks.md"

# Calls captured per graph replay by every cache-kernel timing (the kernels, their baselines
# and the reference copies). A replay pays the graph launch and its events once (a few us);
# 20 calls make that about 1/20 of it per call on every row alike, close to a kernel inside a
# model-sized graph (vLLM). Until 2026-11-30 20:15 UTC the gather rows captured one call per
# input set (two at 79 MB) while the same-bytes copy captured 20: that added about 1 us to
# each gather call (same-run, H200: docs/kernels-cache-index.md, session of 19:56 UTC).
CALLS_PER_REPLAY = 20


def require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise SystemExit("the benchmarks need a CUDA GPU (torch.cuda.is_available() is False)")
    return torch.device("cuda", torch.cuda.current_device())


def fresh_seed() -> int:
    """A new seed from the OS for every run (recorded in the results)."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def l2_bytes(device: torch.device | None = None) -> int:
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


def rotation_count(bytes_per_set: int, *, device: torch.device | None = None,
                   factor: float = 2.0, min_sets: int = 2, max_sets: int = 64) -> int:
    """How many input sets make the rotation at least ``factor`` times the L2 size."""
    need = factor * l2_bytes(device)
    n = -(-int(need) // max(1, int(bytes_per_set)))
    return max(min_sets, min(max_sets, n))


@dataclasses.dataclass
class Timing:
    median_us: float
    min_us: float
    p25_us: float
    p75_us: float
    calls_per_replay: int
    replays: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _quantiles(xs: Sequence[float]) -> tuple[float, float]:
    if len(xs) < 4:
        return min(xs), max(xs)
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def graph_time(calls: Sequence[Callable[[], Any]], *, calls_per_replay: int | None = None,
               warmup_replays: int = 5, replays: int = 30, min_calls: int = 1) -> Timing:
    """Median per-call time (us) of ``calls`` captured into one CUDA graph.

    ``calls`` holds one closure per input set; the graph cycles through them
    ``calls_per_replay`` times in total (default: the number of sets, at least
    ``min_calls``). Each closure is run once eagerly first (JIT compilation, lazy init)."""
    if not calls:
        raise ValueError("graph_time needs at least one call")
    n = max(len(calls), min_calls) if calls_per_replay is None else calls_per_replay
    for fn in calls:  # warm-up outside capture: compiles, allocator, handles
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:  # a second eager pass on the capture stream
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for k in range(n):
            calls[k % len(calls)]()
    torch.cuda.synchronize()
    for _ in range(warmup_replays):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for s, e in zip(starts, ends):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    per_call = [s.elapsed_time(e) * 1000.0 / n for s, e in zip(starts, ends)]
    del graph
    p25, p75 = _quantiles(per_call)
    return Timing(median_us=statistics.median(per_call), min_us=min(per_call), p25_us=p25,
                  p75_us=p75, calls_per_replay=n, replays=replays)


def warm_gpu(seconds: float = 1.0) -> None:
    """Keep the GPU busy for ``seconds`` so clocks leave their idle state before timing
    (an idle H200 reads 345-375 MHz SM clock; the first milliseconds of work run slow)."""
    a = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda").random_()
    b = torch.empty_like(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spent = 0.0
    while spent < seconds * 1000.0:
        start.record()
        for _ in range(50):
            b.copy_(a)
        end.record()
        end.synchronize()
        spent += start.elapsed_time(end)
    del a, b


def _eager_time(fn: Callable[[], Any], *, inner: int = 10, reps: int = 15) -> float:
    """Median per-call time (us) of ``fn`` launched eagerly ``inner`` times between events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0 / inner)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 2 * 2**30, *, replays: int = 30) -> dict[str, Any]:
    """Device-to-device copy bandwidth, GB/s counting read + write (1 GB = 1e9 B), after a
    one-second warm-up: the highest of three ways to copy a buffer (an eager ``copy_``, the
    same captured in a CUDA graph (a memcpy node, which the driver may hand to a copy
    engine), and a graph-replayed elementwise kernel that reads and writes every byte once
    (``bitwise_not``)). Each result is checked."""
    warm_gpu(1.0)
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.int32, device="cuda").random_()
    dst = torch.empty_like(src)
    moved = 2 * n * 4
    ways: dict[str, float] = {}
    dst.zero_()
    ways["eager copy_"] = _eager_time(lambda: dst.copy_(src))
    if not torch.equal(dst, src):
        raise RuntimeError("device copy check failed: dst != src after copy_")
    dst.zero_()
    ways["graph copy_"] = graph_time([lambda: dst.copy_(src)], calls_per_replay=5,
                                     replays=replays).median_us
    if not torch.equal(dst, src):
        raise RuntimeError("device copy check failed: dst != src after graph copy_")
    ways["graph bitwise_not kernel"] = graph_time(
        [lambda: torch.bitwise_not(src, out=dst)], calls_per_replay=5, replays=replays).median_us
    if not torch.equal(dst, torch.bitwise_not(src)):
        raise RuntimeError("device copy check failed: dst != ~src after bitwise_not")
    best = min(ways, key=ways.get)
    src = dst = None  # drop the buffers (not `del`: the timed lambdas above close over them)
    torch.cuda.empty_cache()
    return {"bytes_moved": moved, "median_us": ways[best],
            "gbps_read_plus_write": moved / (ways[best] * 1e-6) / 1e9,
            "by_method_gbps": {k: moved / (v * 1e-6) / 1e9 for k, v in ways.items()},
            "method": f"{best} of a 2 GiB int32 buffer after a 1 s warm-up, median (highest of "
                      f"eager copy_, graph copy_, graph bitwise_not)"}


def same_bytes_copy_time(nbytes: int, *, min_sets: int = 2, replays: int = 30,
                         warm: bool = False) -> Timing:
    """Graph-replayed time of an elementwise kernel (``bitwise_not``) that reads nbytes/2 and
    writes nbytes/2, with as many rotated buffers as the kernel under test gets: what a
    plain copy moving the same total bytes takes at this size (launch, ramp-up and tail
    included). Context for a kernel's percent of the large-buffer copy ceiling.
    ``warm``: one buffer pair called repeatedly (its bytes stay in L2 when they fit), the
    floor for a kernel timed the same way."""
    n = max(1, nbytes // 8)
    sets = 1 if warm else max(min_sets, rotation_count(nbytes))
    bufs = [(torch.empty(n, dtype=torch.int32, device="cuda").random_(),
             torch.empty(n, dtype=torch.int32, device="cuda")) for _ in range(sets)]
    calls = [(lambda a=a, b=b: torch.bitwise_not(a, out=b)) for a, b in bufs]
    t = graph_time(calls, min_calls=CALLS_PER_REPLAY, replays=replays)
    if not torch.equal(bufs[0][1], torch.bitwise_not(bufs[0][0])):
        raise RuntimeError("same-bytes copy check failed")
    del bufs
    return t


def gbps(nbytes: float, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def device_info() -> dict[str, Any]:
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    info: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(dev),
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_mib": round(l2_bytes() / 2**20, 1),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def command_line() -> str:
    """The command that produced the results: ``$DEEPINFER_BENCH_COMMAND`` (set by
    ``make bench``) plus the exact Python invocation."""
    py = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    outer = os.environ.get("DEEPINFER_BENCH_COMMAND")
    return f"{outer} (runs: {py})" if outer else py


def environment_knobs() -> dict[str, str]:
    """The ``DEEPINFER_*`` variables of this run (kernel knobs such as
    ``DEEPINFER_GATHER_EXP``, the extension path ``DEEPINFER_SM80_EXT``), except the command
    line, which ``command_line`` records: a run under a knob or another build says so in its
    JSON and its markdown section."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith("DEEPINFER_") and k not in _NOT_KNOBS}


# the command line (recorded by command_line) and the build cache of tests/vllm_c_ops.py
# (a machine path that changes nothing a benchmark runs)
_NOT_KNOBS = ("DEEPINFER_BENCH_COMMAND", "DEEPINFER_VLLM_C_DIR")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclasses.dataclass
class Report:
    """Collects result rows of one benchmark run and writes JSON + markdown."""

    name: str  # section name in docs/benchmarks.md, file prefix in bench/results/
    title: str
    columns: list[str]  # markdown columns, keys into each row dict
    notes: list[str] = dataclasses.field(default_factory=list)
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    checks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.meta.setdefault("date", utc_now())
        self.meta.setdefault("command", command_line())
        self.meta.setdefault("environment", environment_knobs())
        self.meta.update(device_info())

    def add(self, **row: Any) -> dict[str, Any]:
        self.rows.append(row)
        return row

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        self.checks.append({"what": what, "ok": bool(ok), "detail": detail})
        print(f"[{'PASS' if ok else 'FAIL'}] {what}{': ' + detail if detail else ''}", flush=True)
        return ok

    # ---- output -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "meta": self.meta, "notes": self.notes,
                "checks": self.checks, "rows": self.rows}

    def write_json(self, results_dir: Path = RESULTS_DIR) -> Path:
        results_dir.mkdir(parents=True, exist_ok=True)
        gpu = re.sub(r"[^A-Za-z0-9]+", "-", self.meta.get("gpu", "gpu")).strip("-").lower()
        stamp = self.meta["date"].replace("-", "").replace(":", "").replace(" UTC", "")
        stamp = stamp.replace(" ", "T")
        path = results_dir / f"{self.name}_{gpu}_{stamp}.json"
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n")
        return path

    @staticmethod
    def _fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "NO"
        if isinstance(v, float):
            if abs(v) >= 100:
                return f"{v:.0f}"
            if abs(v) >= 10:
                return f"{v:.1f}"
            return f"{v:.2f}"
        return str(v).replace("|", "\\|")

    def markdown(self) -> str:
        m = self.meta
        lines = [f"### {self.title}", "",
                 f"- GPU: {m['gpu']} ({m['sm_count']} SMs, compute capability {m['capability']}, "
                 f"L2 {m['l2_mib']} MiB); torch {m['torch']} (CUDA {m['cuda_runtime']}), "
                 f"triton {m['triton']}, Python {m['python']}",
                 f"- Date: {m['date']}",
                 f"- Command: `{m['command']}`"]
        if m.get("environment"):
            lines.append("- Set for this run (kernel knobs, extension): "
                         + ", ".join(f"`{k}={v}`" for k, v in m["environment"].items()))
        if "copy" in m:
            both = [m[k]["gbps_read_plus_write"] for k in ("copy_start", "copy", "copy_end")
                    if k in m]
            extra = (f"; the higher of {' and '.join(f'{v:.0f}' for v in both)} GB/s measured "
                     f"at the start and the end of the run" if len(both) > 1 else "")
            ways = m["copy"].get("by_method_gbps") or {}
            ways_txt = ("; by method: " + ", ".join(f"{k} {v:.0f}" for k, v in ways.items())
                        if ways else "")
            lines.append(f"- Device-to-device copy, measured in the same run: "
                         f"{m['copy']['gbps_read_plus_write']:.0f} GB/s (read + write, "
                         f"{m['copy']['method']}{ways_txt}{extra}); `pct_copy` is relative "
                         f"to it")
        lines += [f"- {n}" for n in self.notes]
        lines += ["", "| " + " | ".join(self.columns) + " |",
                  "|" + "|".join("---" for _ in self.columns) + "|"]
        for r in self.rows:
            lines.append("| " + " | ".join(self._fmt(r.get(c)) for c in self.columns) + " |")
        if self.checks:
            lines += ["", "Checks in the same run:", ""]
            lines += [f"- {'PASS' if c['ok'] else 'FAIL'}: {c['what']}"
                      + (f" ({c['detail']})" if c["detail"] else "") for c in self.checks]
        return "\n".join(lines) + "\n"

    def write_markdown(self, doc: Path = BENCH_DOC) -> Path:
        """Replace (or append) this report's section between its markers in ``doc``."""
        begin, end = f"<!-- BEGIN {self.name} -->", f"<!-- END {self.name} -->"
        block = f"{begin}\n{self.markdown()}{end}\n"
        text = doc.read_text() if doc.is_file() else "# Benchmarks\n\n"
        pat = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
        text = pat.sub(lambda _: block, text) if pat.search(text) else text.rstrip("\n") + "\n\n" + block
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(text)
        return doc

    def print_table(self) -> None:
        print(self.markdown(), flush=True)

    def finish(self, write_doc: bool = True, *, results_dir: Path = RESULTS_DIR,
               doc: Path = BENCH_DOC) -> int:
        """A benchmark script's end: the JSON, the markdown section (unless ``write_doc`` is
        false: ``--no-doc``), the table; returns the exit status, 1 when a check failed."""
        print(f"results: {self.write_json(results_dir)}")
        if write_doc:
            print(f"markdown: {self.write_markdown(doc)}")
        self.print_table()
        return 1 if any(not c["ok"] for c in self.checks) else 0
