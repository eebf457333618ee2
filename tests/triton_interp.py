"""Shared set-up of the tests that run Triton kernels under the interpreter on CPU
(TRITON_INTERPRET=1, set by the caller before triton is imported).

Triton 3.6's interpreter converts shape-[1] arrays with ``int()``, which numpy >= 2.4
rejects; ``patch_index`` makes interpreter tensors convert through their first element.
"""

from __future__ import annotations


def patch_index() -> None:
    import triton.runtime.interpreter as ti

    orig = ti._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    ti._patch_lang_tensor = patched
