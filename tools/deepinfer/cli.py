"""Command-line interface: ``deepinfer <command>`` (the make targets call it).

Thin layer: each command parses its options and calls one function of a command module.
Errors the user can act on (:class:`deepinfer.console.DeepinferError`) print as
``error: ... / hint: ...`` and exit non-zero; Ctrl-C exits 130.

Other modules add commands by appending a ``register(subparsers)`` function to
:data:`REGISTRARS` (see the block at the end of this file).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from .console import DeepinferError, report_error


def _common(p: argparse.ArgumentParser, source_opts: bool = True) -> None:
    p.add_argument("--vllm", default=os.environ.get("VLLM", "0.33.0"),
                   help="upstream vLLM version (patch set patches/vllm-<ver>/); env VLLM")
    if source_opts:
        p.add_argument("--source", default=os.environ.get("SOURCE") or "sdist",
                       help="sdist (default) | git | path:DIR; env SOURCE")
        p.add_argument("--git-url", default=os.environ.get("GIT_URL") or None,
                       help="git URL or local clone for --source git; env GIT_URL")


def _spec(args):
    from .source import SourceSpec
    return SourceSpec.parse(args.source, args.git_url)


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def cmd_apply(args) -> int:
    from . import apply as ap
    res = ap.apply(args.vllm, _spec(args), force=args.force)
    ap.print_summary(res)
    return 0


def cmd_check(args) -> int:
    from . import apply as ap
    ap.check(args.vllm, _spec(args))
    return 0


def cmd_status(args) -> int:
    from . import apply as ap
    st = ap.status(args.vllm, _spec(args))
    ok = ap.print_status(args.vllm, st, ap.build_root())
    return 0 if ok else 1


def cmd_clean(args) -> int:
    from . import apply as ap
    ap.clean()
    return 0


def cmd_export(args) -> int:
    from . import export as ex
    ex.export(args.vllm)
    return 0


def cmd_manifest(args) -> int:
    from . import manifest as mf
    mf.manifest(args.vllm, _spec(args))
    return 0


def cmd_fetch(args) -> int:
    from . import patchset, source
    ps = patchset.load_patchset(args.vllm)
    path = source.ensure_sdist(ps.pin)
    print(path)
    return 0


def register_core(sub) -> None:
    p = sub.add_parser("apply", help="materialise build/vllm-<ver> (base + patches + overlay)")
    _common(p)
    p.add_argument("--force", action="store_true", default=_truthy(os.environ.get("FORCE")),
                   help="rebuild even when the tree has edits (they are backed up); env FORCE=1")
    p.set_defaults(func=cmd_apply)
    p = sub.add_parser("check", help="dry run: does every patch apply to the pinned base?")
    _common(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("status", help="is the tree exactly base + series + overlay?")
    _common(p)
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("clean", help="remove build/")
    p.set_defaults(func=cmd_clean)
    p = sub.add_parser("export", help="write the tree's commits back as patch files + series")
    _common(p, source_opts=False)
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("manifest", help="regenerate the overlay manifest (overlay.toml)")
    _common(p)
    p.set_defaults(func=cmd_manifest)
    p = sub.add_parser("fetch", help="download + verify the pinned sdist into the cache")
    _common(p, source_opts=False)
    p.set_defaults(func=cmd_fetch)


#: Functions that add subcommands. Modules owned by other areas append theirs below.
REGISTRARS: list[Callable] = [register_core]

# ---- commands contributed by other modules (one guarded block per module) -------------
# e.g.:
# from .drift import register as _register_drift; REGISTRARS.append(_register_drift)
# drift + rebase (issue 3; tools/deepinfer/drift.py, rebase.py)
from .drift import register as _register_drift; REGISTRARS.append(_register_drift)  # noqa: E402,E702
from .rebase import register as _register_rebase; REGISTRARS.append(_register_rebase)  # noqa: E402,E702
# build + build-check (issue 4; tools/deepinfer/build.py)
from .build import register as _register_build; REGISTRARS.append(_register_build)  # noqa: E402,E702
# ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinfer", description="DeepInfer-SM80 patch tool")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    sub.required = True
    for reg in REGISTRARS:
        reg(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DeepinferError as exc:
        report_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        report_error(DeepinferError("interrupted; the previous tree (if any) is unchanged"))
        return 130


if __name__ == "__main__":
    sys.exit(main())
