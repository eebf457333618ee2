# DeepInfer-SM80 top-level Makefile.
# Every target sets up what it needs itself: the project virtualenv (.venv) is created on
# first use, so a fresh machine needs only python3, git and make.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
VLLM     ?= 0.33.0
SOURCE   ?= sdist
FORCE    ?= 0
ARCHS    ?= 8.0 8.6
TORCH_VERSION ?= 2.13.0
TRITON_VERSION ?= 3.6.0

export VLLM SOURCE FORCE ARCHS

STAMP_TOOL  := $(VENV)/.stamp-tool
STAMP_TORCH := $(VENV)/.stamp-torch

$(STAMP_TOOL): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	@$(PY) -m pip install -q -e '.[test]'
	@touch $@

# torch (CPU build is enough for the CPU tests); kept separate because it is large.
$(STAMP_TORCH): $(STAMP_TOOL)
	@$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q torch==$(TORCH_VERSION) ninja numpy
	@$(PY) -c 'import triton' 2>/dev/null || $(PY) -m pip install -q triton==$(TRITON_VERSION)
	@$(PY) -c 'import fastapi, transformers, xgrammar, tilelang' 2>/dev/null || $(PY) -m pip install -q -e '.[vllm-cpu-deps]'
	@touch $@

.PHONY: venv venv-torch help
venv: $(STAMP_TOOL)
venv-torch: $(STAMP_TORCH)

help:
	@echo "make apply [VLLM=$(VLLM)] [SOURCE=sdist|git|path:DIR] [FORCE=1]  patched vLLM tree in build/vllm-<ver>"
	@echo "    patch sets (VLLM=): $(patsubst patches/vllm-%,%,$(wildcard patches/vllm-*)); default $(VLLM) (the pin)"
	@echo "make check | status | clean                          dry run / tree state / remove build/"
	@echo "make test                                            regression suite (GPU tests skip on CPU)"
	@echo "make drift AGAINST=<ver> | rebase TO=<ver> | export  maintainer targets"
	@echo "make build [ARCHS='8.0 8.6'] | build-check | bench | gpu-bundle | gpu-test"

# Targets contributed by each area live in mk/*.mk.
include $(sort $(wildcard mk/*.mk))
