# Kernel extension targets (csrc/ -> deepinfer_sm80._C; tools/deepinfer/build.py).
#   make build [ARCHS="8.0 8.6"] [BUILD_DIR=overlay] [EXTRA_GENCODE=compute_80:sm_90]
#       compile csrc/**/*.cu,*.cpp into one extension for ARCHS (+PTX of the highest) and
#       install it into the applied tree build/vllm-$(VLLM)/deepinfer_sm80/ and/or
#       BUILD_DIR/deepinfer_sm80/ (BUILD_DIR=overlay: in-repo, for the tests).
#   make build-check   per-kernel registers/smem/stack/spills for sm_80 + sm_86 (nvcc only;
#                      fails on a spill; skips with a message when nvcc is absent)
#   make gpu-test      GPU tests (tests/gpu; they skip without CUDA)
#   make doctor [DOCTOR_ARGS="--json"]  can this machine run the kernels? (GPU, limits, the
#                      built extension's code for this GPU, its ops, a smoke run, vLLM's
#                      overlay identity; python -m deepinfer_sm80.doctor in the applied tree)
# On a GPU box without the project venv (offline), KPY picks the system python3.
BUILD_DIR     ?=
EXTRA_GENCODE ?=
KPY           ?= $(if $(wildcard $(PY)),$(PY),python3)
KBUILD        := PYTHONPATH=tools$(if $(PYTHONPATH),:$(PYTHONPATH)) $(KPY) -m deepinfer.build

.PHONY: build build-check gpu-test doctor
DOCTOR_ARGS   ?=

build:
	@$(KBUILD) build --archs '$(ARCHS)' \
	  $(if $(wildcard build/vllm-$(VLLM)),--target build/vllm-$(VLLM)) \
	  $(if $(BUILD_DIR),--target '$(BUILD_DIR)') \
	  $(if $(EXTRA_GENCODE),--extra-gencode '$(EXTRA_GENCODE)')

build-check:
	@$(KBUILD) check

gpu-test:
	@PYTHONPATH=tools:overlay$(if $(PYTHONPATH),:$(PYTHONPATH)) $(KPY) -m pytest -q tests/gpu $(PYTEST_ARGS)

doctor:
	@PYTHONPATH=$(if $(BUILD_DIR),$(BUILD_DIR),build/vllm-$(VLLM))$(if $(PYTHONPATH),:$(PYTHONPATH)) \
	  $(KPY) -m deepinfer_sm80.doctor $(DOCTOR_ARGS)
