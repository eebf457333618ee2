# SPDX-License-Identifier: Apache-2.0
"""Identity of the DeepInfer-SM80 overlay in this vLLM tree.

``vllm.__version__`` stays upstream's release string, because plugins and
tools branch on it. Ask this module instead whether (and which) DeepInfer-SM80
patch set and overlay this tree carries::

    from vllm import deepinfer_sm80_overlay as overlay

    overlay.describe()  # 'deepinfer-sm80 0.1.0 on vLLM 0.33.0 (4ba787ec9)'
    overlay.check_upstream()  # raises if the running vLLM is not the pinned one

Importing it imports nothing from vLLM; ``check_upstream()`` reads
``vllm._version`` when called.
"""

from __future__ import annotations

#: Distribution name and version of the overlay (DeepInfer-SM80's pyproject.toml).
OVERLAY_NAME = "deepinfer-sm80"
OVERLAY_VERSION = "0.1.0"

#: The upstream release the patch set is pinned to (patches/vllm-0.33.0/pin.toml).
PINNED_VLLM_VERSION = "0.33.0"
#: Abbreviated upstream commit, as the release's ``vllm/_version.py`` records it
#: (``__commit_id__ = 'g4ba787ec9'``).
PINNED_VLLM_COMMIT = "4ba787ec9"
#: The full 40-character commit id, when the pin records one (it does not yet).
PINNED_VLLM_COMMIT_FULL: str | None = None


def identity() -> dict[str, str | None]:
    """The overlay's identity as a plain dict (for logs and bug reports)."""
    return {
        "overlay": OVERLAY_NAME,
        "overlay_version": OVERLAY_VERSION,
        "vllm_version": PINNED_VLLM_VERSION,
        "vllm_commit": PINNED_VLLM_COMMIT,
        "vllm_commit_full": PINNED_VLLM_COMMIT_FULL,
    }


def describe() -> str:
    """One line: overlay name and version, and the vLLM release it is pinned to."""
    return (
        f"{OVERLAY_NAME} {OVERLAY_VERSION} on vLLM {PINNED_VLLM_VERSION} "
        f"({PINNED_VLLM_COMMIT})"
    )


def check_upstream() -> None:
    """Raise ``RuntimeError`` unless the vLLM this module lives in is the pinned
    release, e.g. when the overlay files were copied into another vLLM install."""
    from vllm import _version

    version = _version.__version__
    commit = (_version.__commit_id__ or "").removeprefix("g")
    if version != PINNED_VLLM_VERSION or not commit.startswith(PINNED_VLLM_COMMIT):
        raise RuntimeError(
            f"{describe()} is installed into vLLM {version} "
            f"({commit or 'no commit id'}); its patches and overlay were written "
            f"for vLLM {PINNED_VLLM_VERSION} "
            f"({PINNED_VLLM_COMMIT}). Rebuild the tree with `make apply` for the vLLM "
            "release you run, or install the tree `make apply` produced."
        )
