# Maintainer targets for moving upstream (docs/drift.md):
#   make drift [AGAINST=<version>|latest|<git rev>|path:DIR] [STRICT=1]
#   make rebase TO=<version> [FORCE=1]      then, after a conflict: make rebase-continue TO=<version>
# VLLM (default 0.33.0) names the patch set to check / move.
AGAINST ?=
TO      ?=
STRICT  ?= 0

.PHONY: drift rebase rebase-continue

drift: $(STAMP_TOOL)
	@$(PY) -m deepinfer.cli drift --vllm '$(VLLM)' $(if $(AGAINST),--against '$(AGAINST)') \
		$(if $(filter 1 yes true,$(STRICT)),--strict)

rebase: $(STAMP_TOOL)
	@test -n '$(TO)' || { echo "usage: make rebase TO=<vLLM version> [FORCE=1]" >&2; exit 2; }
	@$(PY) -m deepinfer.cli rebase --to '$(TO)' --vllm '$(VLLM)' $(if $(filter 1,$(FORCE)),--force)

rebase-continue: $(STAMP_TOOL)
	@test -n '$(TO)' || { echo "usage: make rebase-continue TO=<vLLM version>" >&2; exit 2; }
	@$(PY) -m deepinfer.cli rebase --to '$(TO)' --continue
