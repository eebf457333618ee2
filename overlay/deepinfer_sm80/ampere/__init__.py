"""Kernel-level DeepSeek-V4 layer steps for Ampere (indexer, o_proj, decode/prefill steps).

Imports only torch and triton (and the built extension when present), so it can be tested
on a GPU box without vLLM; the vLLM-facing adapters in
``vllm/models/deepseek_v4/nvidia/ampere_*.py`` are thin wrappers over it.
"""
