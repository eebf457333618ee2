"""Torch reference implementations (CPU-runnable oracles), written from the semantics."""
