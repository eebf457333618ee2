"""deepinfer: the DeepInfer-SM80 patch tool.

Turns a pinned upstream vLLM release, an ordered patch series and a Python/CUDA overlay
into a patched vLLM source tree (``make apply``), and back (``make export``).

Layers: :mod:`.source` (fetch + verify upstream) -> :mod:`.gittree` (git operations) ->
:mod:`.patchset` (pin, series, overlay manifest) -> :mod:`.apply` / :mod:`.export` ->
:mod:`.cli`.
"""
__version__ = "0.1.0"
