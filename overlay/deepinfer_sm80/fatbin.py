"""Which GPU code a CUDA library carries: the machine code (SASS) architectures and the PTX
versions of its fat binaries, read from the file without loading it (no CUDA, no torch).

nvcc embeds one fat binary per compilation unit (section ``.nv_fatbin`` of the shared
library). Each starts with a 16-byte header (magic ``0xBA55ED50``, version, header size,
size of its entries) followed by entries whose headers give the kind (1 = PTX, 2 = ELF, i.e.
machine code) at byte 0, the header size at byte 4, the padded payload size at byte 8 and the
architecture (80 for sm_80 / compute_80) at byte 28. Payloads may be compressed; only the
headers are read here.

    code_in_library("deepinfer_sm80/_C.so")  # LibraryCode(sass=(80, 86), ptx=(86,))
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", MAGIC)
KIND_PTX, KIND_ELF = 1, 2


@dataclass(frozen=True)
class LibraryCode:
    """Architectures (compute capability x 10) with machine code, and with PTX."""

    sass: tuple[int, ...]
    ptx: tuple[int, ...]

    def runs_on(self, capability: int) -> str:
        """How a device of ``capability`` (e.g. 86) gets this library's kernels: ``"sass"``
        (machine code built for it), ``"ptx"`` (the driver compiles the newest PTX not newer
        than the device when the library loads) or ``"none"``. Machine code for an older minor
        version of the same major also runs (sm_80 code on an 8.6 device): ``"sass"`` too."""
        if capability in self.sass or any(a // 10 == capability // 10 and a <= capability
                                           for a in self.sass):
            return "sass"
        if any(a <= capability for a in self.ptx):
            return "ptx"
        return "none"


def _entries(blob: bytes, start: int) -> tuple[list[tuple[int, int]], int] | None:
    """(kind, arch) of the entries of the fat binary at ``start``, and where it ends; None if
    the bytes there are not a well-formed fat binary."""
    if start + 16 > len(blob):
        return None
    _, _, hsize, size = struct.unpack_from("<IHHQ", blob, start)
    end = start + hsize + size
    if hsize < 16 or end > len(blob):
        return None
    out, p = [], start + hsize
    while p + 32 <= end:
        kind, _, ehsize, padded = struct.unpack_from("<HHIQ", blob, p)
        arch = struct.unpack_from("<I", blob, p + 28)[0]
        if kind not in (KIND_PTX, KIND_ELF) or ehsize < 32 or p + ehsize + padded > end:
            return None
        out.append((kind, arch))
        p += ehsize + padded
    return out, end


def code_in_bytes(blob: bytes) -> LibraryCode:
    """The SASS and PTX architectures of every fat binary found in ``blob``."""
    sass, ptx = set(), set()
    i = blob.find(_MAGIC_BYTES)
    while i >= 0:
        got = _entries(blob, i)
        nxt = i + 4
        if got is not None:
            entries, nxt = got
            for kind, arch in entries:
                (ptx if kind == KIND_PTX else sass).add(arch)
        i = blob.find(_MAGIC_BYTES, nxt)
    return LibraryCode(tuple(sorted(sass)), tuple(sorted(ptx)))


def code_in_library(path: str | Path) -> LibraryCode:
    """:func:`code_in_bytes` of the file at ``path``."""
    return code_in_bytes(Path(path).read_bytes())
