"""Does the overlay still fit a different upstream?

For every overlay file (see :func:`deepinfer.patchset.overlay_files`):

- ``collision``          a new file whose path upstream now uses
- ``upstream-changed``   a replaced file whose upstream blob differs from the pinned one
                         (the upstream diff is attached)
- ``upstream-missing``   a replaced file upstream no longer has
- ``vanished-symbol``    a Python module that imports, subclasses or calls something from
                         the tree that existed at the pin and no longer exists at the target
- ``ok``                 none of the above

Python references are checked with :mod:`ast` against the tree as the overlay sees it:
overlay files first, then upstream files with the patch series applied, then upstream.
A reference only counts as vanished when it resolves at the pin and not at the target,
so the check never blames upstream for what the resolver cannot see.
"""
from __future__ import annotations

import ast
import difflib
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field

from .hunkstatus import decode, git_blob_id

OK, COLLISION, CHANGED, MISSING, VANISHED = (
    "ok", "collision", "upstream-changed", "upstream-missing", "vanished-symbol")
OVERLAY_STATUSES = (OK, COLLISION, CHANGED, MISSING, VANISHED)
_SEVERITY = {OK: 0, CHANGED: 1, VANISHED: 2, MISSING: 3, COLLISION: 3}
MAX_DIFF_LINES = 400


# --------------------------------------------------------------------------- module view
class TreeView:
    """Python modules of a tree seen through layers: ``read(path)`` and ``paths``."""

    def __init__(self, paths: set[str], read: Callable[[str], bytes | None]):
        self.paths = paths
        self._read = read
        self._dirs: set[str] | None = None
        self._parsed: dict[str, tuple[set[str], list[str], bool] | None] = {}

    def dirs(self) -> set[str]:
        if self._dirs is None:
            d: set[str] = set()
            for p in self.paths:
                parent = posixpath.dirname(p)
                while parent and parent not in d:
                    d.add(parent)
                    parent = posixpath.dirname(parent)
            self._dirs = d
        return self._dirs

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.paths:
                return cand
        return None

    def module_exists(self, module: str) -> bool:
        return self.module_file(module) is not None or module.replace(".", "/") in self.dirs()

    def _names(self, path: str) -> tuple[set[str], list[str], bool] | None:
        """(names bound at module level, star-import sources, has module __getattr__)."""
        if path not in self._parsed:
            data = self._read(path)
            try:
                tree = ast.parse(decode(data)) if data is not None else None
            except SyntaxError:
                tree = None
            if tree is None:
                self._parsed[path] = None
            else:
                self._parsed[path] = _module_bindings(tree, _package_of(path))
        return self._parsed[path]

    def defines(self, module: str, name: str, depth: int = 0) -> bool | None:
        """True/False: whether ``module`` has ``name``; None: cannot tell (dynamic)."""
        if not self.module_exists(module):
            return False
        if self.module_exists(f"{module}.{name}"):
            return True
        path = self.module_file(module)
        if path is None:
            return False  # namespace package without such a submodule
        info = self._names(path)
        if info is None:
            return None
        names, stars, dynamic = info
        if name in names:
            return True
        unknown = dynamic
        for src in stars:
            if depth < 4 and self.module_exists(src):
                r = self.defines(src, name, depth + 1)
                if r:
                    return True
                unknown = unknown or r is None
            else:
                unknown = True
        return None if unknown else False


def _package_of(path: str) -> str:
    mod = path[:-3].replace("/", ".") if path.endswith(".py") else path.replace("/", ".")
    if mod.endswith(".__init__"):
        return mod[: -len(".__init__")]
    return mod.rpartition(".")[0]


def _resolve_relative(package: str, module: str | None, level: int) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    if module:
        base.append(module)
    return ".".join(base) or None


def _module_bindings(tree: ast.Module, package: str) -> tuple[set[str], list[str], bool]:
    names: set[str] = set()
    stars: list[str] = []
    dynamic = False

    def targets(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                targets(e)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def walk(stmts: list[ast.stmt]) -> None:
        nonlocal dynamic
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(st.name)
                dynamic = dynamic or st.name == "__getattr__"
            elif isinstance(st, ast.Assign):
                for t in st.targets:
                    targets(t)
            elif isinstance(st, (ast.AnnAssign, ast.AugAssign)):
                targets(st.target)
            elif isinstance(st, ast.Import):
                for a in st.names:
                    names.add(a.asname or a.name.split(".")[0])
            elif isinstance(st, ast.ImportFrom):
                for a in st.names:
                    if a.name == "*":
                        src = _resolve_relative(package, st.module, st.level)
                        if src:
                            stars.append(src)
                    else:
                        names.add(a.asname or a.name)
            elif isinstance(st, (ast.For, ast.AsyncFor)):
                targets(st.target)
                walk(st.body)
                walk(st.orelse)
            elif isinstance(st, (ast.With, ast.AsyncWith)):
                for item in st.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                walk(st.body)
            elif isinstance(st, (ast.If, ast.While)):
                walk(st.body)
                walk(st.orelse)
            elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
                walk(st.body)
                for h in st.handlers:
                    if h.name:
                        names.add(h.name)
                    walk(h.body)
                walk(st.orelse)
                walk(st.finalbody)
    walk(tree.body)
    return names, stars, dynamic


# --------------------------------------------------------------------------- references
@dataclass(frozen=True)
class Ref:
    kind: str     # import | base-class | call
    module: str   # dotted module the name is looked up in
    name: str     # "" for a plain `import module`
    line: int
    optional: bool  # inside try/except ImportError

    def label(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


_OPTIONAL_EXC = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


def references(source: str, tree_path: str, roots: set[str]) -> list[Ref]:
    """What a module takes from the tree's packages ``roots`` (imports, base classes,
    calls through an imported name)."""
    tree = ast.parse(source)
    package = _package_of(tree_path)
    bound: dict[str, str] = {}  # local name -> dotted target ("vllm.x.Y" or "vllm.x")
    refs: list[Ref] = []

    def in_roots(mod: str | None) -> bool:
        return bool(mod) and mod.split(".")[0] in roots

    def visit(node: ast.AST, optional: bool) -> None:
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            catches = set()
            for h in node.handlers:
                if h.type is None:
                    catches.add("BaseException")
                for t in ([h.type] if h.type is not None else []):
                    for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        if isinstance(e, ast.Name):
                            catches.add(e.id)
            opt_body = optional or bool(catches & _OPTIONAL_EXC)
            for st in node.body:
                visit(st, opt_body)
            for part in (node.handlers, node.orelse, node.finalbody):
                for st in part:
                    visit(st, optional)
            return
        if isinstance(node, ast.ImportFrom):
            mod = _resolve_relative(package, node.module, node.level)
            if in_roots(mod):
                for a in node.names:
                    if a.name == "*":
                        refs.append(Ref("import", mod, "", node.lineno, optional))
                        continue
                    refs.append(Ref("import", mod, a.name, node.lineno, optional))
                    bound[a.asname or a.name] = f"{mod}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if in_roots(a.name):
                    refs.append(Ref("import", a.name, "", node.lineno, optional))
                    if a.asname:
                        bound[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        bound[root] = root
        elif isinstance(node, ast.ClassDef):
            for b in node.bases:
                _use(b, "base-class", node.lineno, optional)
        elif isinstance(node, ast.Call):
            _use(node.func, "call", node.lineno, optional)
        for child in ast.iter_child_nodes(node):
            visit(child, optional)

    def _use(expr: ast.AST, kind: str, line: int, optional: bool) -> None:
        parts = _dotted(expr)
        if not parts or parts[0] not in bound:
            return
        full = bound[parts[0]].split(".") + parts[1:]
        refs.append(Ref(kind, ".".join(full[:-1]), full[-1], line, optional))

    visit(tree, False)
    seen: set[tuple] = set()
    out = []
    for r in refs:
        key = (r.kind, r.module, r.name)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def resolves(view: TreeView, ref: Ref) -> bool | None:
    """Whether ``ref`` exists in ``view``; for dotted chains the longest module prefix
    is the module and the next component the name."""
    if not ref.name:
        return view.module_exists(ref.module)
    parts = ref.module.split(".")
    # `mod.sub.func` where only `mod` is a module: walk down to the deepest module
    for cut in range(len(parts), 0, -1):
        mod = ".".join(parts[:cut])
        if view.module_exists(mod):
            rest = parts[cut:] + [ref.name]
            return view.defines(mod, rest[0])
    return False


# --------------------------------------------------------------------------- findings
@dataclass
class OverlayResult:
    path: str          # path in the tree
    source: str        # path in this repository
    kind: str          # new | replace
    status: str = OK
    findings: list[dict] = field(default_factory=list)
    upstream_diff: str = ""

    def add(self, status: str, detail: str, **extra) -> None:
        self.findings.append({"status": status, "detail": detail, **extra})
        if _SEVERITY[status] > _SEVERITY[self.status]:
            self.status = status

    def to_json(self) -> dict:
        return {"path": self.path, "source": self.source, "kind": self.kind,
                "status": self.status, "findings": self.findings,
                "upstream_diff": self.upstream_diff}


def upstream_diff(path: str, old: bytes | None, new: bytes | None,
                  old_label: str, new_label: str) -> str:
    a = decode(old).splitlines(keepends=True) if old is not None else []
    b = decode(new).splitlines(keepends=True) if new is not None else []
    lines = list(difflib.unified_diff(a, b, f"a/{path} ({old_label})", f"b/{path} ({new_label})"))
    if len(lines) > MAX_DIFF_LINES:
        lines = lines[:MAX_DIFF_LINES] + [f"... ({len(lines) - MAX_DIFF_LINES} more lines)\n"]
    return "".join(x if x.endswith("\n") else x + "\n" for x in lines)


@dataclass
class OverlayEntry:
    path: str
    source: str
    kind: str           # new | replace
    upstream_blob: str  # pinned upstream blob of a replaced file ("" for new)
    data: bytes


def check_overlay(entries: list[OverlayEntry], pin_view: TreeView, target_view: TreeView,
                  pin_read: Callable[[str], bytes | None],
                  target_read: Callable[[str], bytes | None],
                  target_paths: set[str], pin_label: str, target_label: str
                  ) -> list[OverlayResult]:
    """Findings for every overlay entry.  ``*_view`` see the overlay layered on top of
    the (patched) upstream; ``*_read``/``target_paths`` see upstream alone."""
    roots = {p.split("/")[0] for p in target_view.paths if p.endswith("/__init__.py")
             and p.count("/") == 1}
    roots |= {e.path.split("/")[0] for e in entries if e.path.endswith(".py")}
    results = []
    for e in sorted(entries, key=lambda e: e.path):
        res = OverlayResult(e.path, e.source, e.kind)
        up_now = target_read(e.path) if e.path in target_paths else None
        if e.kind == "new" and up_now is not None:
            res.add(COLLISION, f"upstream {target_label} now has {e.path} "
                    f"(blob {git_blob_id(up_now)[:12]}); the overlay would replace it",
                    upstream_blob=git_blob_id(up_now))
        elif e.kind == "replace":
            if up_now is None:
                res.add(MISSING, f"upstream {target_label} no longer has {e.path}")
            else:
                blob = git_blob_id(up_now)
                if e.upstream_blob and blob != e.upstream_blob:
                    res.add(CHANGED, f"upstream blob changed {e.upstream_blob[:12]} -> "
                            f"{blob[:12]}; review the upstream diff and port it",
                            old_blob=e.upstream_blob, new_blob=blob)
                    res.upstream_diff = upstream_diff(e.path, pin_read(e.path), up_now,
                                                      pin_label, target_label)
        if e.path.endswith(".py"):
            try:
                refs = references(decode(e.data), e.path, roots)
            except SyntaxError as exc:
                refs = []
                res.findings.append({"status": "note", "detail": f"not parseable: {exc}"})
            for r in refs:
                at_pin = resolves(pin_view, r)
                if at_pin is False or at_pin is None:
                    continue
                at_target = resolves(target_view, r)
                if at_target is False:
                    what = {"import": "imports", "base-class": "subclasses",
                            "call": "calls"}[r.kind]
                    detail = (f"line {r.line} {what} {r.label()}, which {target_label} "
                              f"no longer has" + (" (optional import)" if r.optional else ""))
                    if r.optional:
                        res.findings.append({"status": "note", "detail": detail,
                                             "kind": r.kind, "symbol": r.label(),
                                             "line": r.line})
                    else:
                        res.add(VANISHED, detail, kind=r.kind, symbol=r.label(), line=r.line)
        results.append(res)
    return results
