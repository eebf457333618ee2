"""DeepInfer-SM80 kernel package: SM80/SM86 CUDA kernels for DeepSeek-V4 in vLLM.

* ``deepinfer_sm80.ops``       - drop-in replacements of upstream ops (need the built
  extension ``_C``, loaded on first use by :mod:`deepinfer_sm80._ext`);
* ``deepinfer_sm80.reference`` - torch reference implementations (run on CPU; the oracles
  of the tests).

Importing this package loads nothing: the reference modules work without a GPU build.
"""

__all__ = ["ops", "reference"]
