# Patch tool targets (tools/deepinfer). Variables: VLLM, SOURCE, FORCE, GIT_URL
# (see `make help`). Each target sets up the project virtualenv on first use.
DEEPINFER := $(PY) -m deepinfer.cli

.PHONY: apply check status clean export manifest fetch test

apply: $(STAMP_TOOL)
	@$(DEEPINFER) apply --vllm '$(VLLM)' --source '$(SOURCE)'

check: $(STAMP_TOOL)
	@$(DEEPINFER) check --vllm '$(VLLM)' --source '$(SOURCE)'

status: $(STAMP_TOOL)
	@$(DEEPINFER) status --vllm '$(VLLM)' --source '$(SOURCE)'

clean: $(STAMP_TOOL)
	@$(DEEPINFER) clean

export: $(STAMP_TOOL)
	@$(DEEPINFER) export --vllm '$(VLLM)'

manifest: $(STAMP_TOOL)
	@$(DEEPINFER) manifest --vllm '$(VLLM)' --source '$(SOURCE)'

fetch: $(STAMP_TOOL)
	@$(DEEPINFER) fetch --vllm '$(VLLM)'

# Regression suite. GPU tests skip on CPU; tests marked `network` use the cached sdist
# (downloaded once). PYTEST_ARGS passes extra options, e.g. PYTEST_ARGS='-k apply'.
test: $(STAMP_TORCH)
	@$(PY) -m pytest $(PYTEST_ARGS)
