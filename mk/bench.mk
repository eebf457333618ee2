# GPU benchmarks and the offline GPU bundle (docs/benchmarks.md, tools/deepinfer/bundle.py).
#   make bench [BENCH=cache] [BENCH_ARGS='--quick']
#                                       every bench/bench_*.py (or bench_$(BENCH).py): CUDA-graph medians vs upstream
#                                       and portable baselines, measured copy bandwidth;
#                                       writes bench/results/*.json and docs/benchmarks.md
#   make gpu-bundle [TREE=DIR] [VLLM_DEPS=1]
#                                       dist/deepinfer-gpu-bundle.tar.gz for an offline GPU box
#                                       (TREE: vLLM tree, default the applied build/vllm-$(VLLM);
#                                       VLLM_DEPS=1: with vLLM's Python dependencies, for the
#                                       vLLM-level GPU checks; 33 MB against 11 MB)
BENCH      ?= *
BENCH_ARGS ?=
TREE       ?= build/vllm-$(VLLM)
VLLM_DEPS  ?=

.PHONY: bench gpu-bundle

bench: $(STAMP_TORCH)
	@rc=0; for f in bench/bench_$(BENCH).py; do \
		[ -f "$$f" ] || { echo "no $$f" >&2; rc=1; continue; }; \
		echo "== $$f"; \
		DEEPINFER_BENCH_COMMAND="make bench$(if $(filter-out *,$(BENCH)), BENCH=$(BENCH))$(if $(BENCH_ARGS), BENCH_ARGS='$(BENCH_ARGS)')" \
			$(PY) $$f $(BENCH_ARGS) || rc=1; \
	done; exit $$rc

gpu-bundle: $(STAMP_TOOL)
	@$(PY) -m deepinfer.bundle --vllm '$(VLLM)' --tree '$(TREE)'$(if $(filter 1 yes true,$(VLLM_DEPS)), --vllm-deps)
