# Loops build. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO ?= go
TOOLS := $(GO) tool -modfile=tools/go.mod
PROTODEPS := .cache/protodeps
# googleapis' annotations/http protos, taken from this pinned module at generate time (never committed).
GOOGLEAPIS_MODULE := github.com/grpc-ecosystem/grpc-gateway/v2@v2.2.0
# SeaweedFS's weed, the real S3-compatible server that the checkpoint store's S3 tests start
# (gateway/ckstore/s3test), built from this pinned module once per machine into
# ~/.cache/loops/bin/weed-VERSION, outside the work tree so fresh clones (CI) reuse it; the
# tests find it through the link ~/.cache/loops/bin/weed.
WEED_MODULE := github.com/seaweedfs/seaweedfs
WEED_VERSION := v0.0.0-20261109003541-7506e5f91cd6
WEED_DIR := $(HOME)/.cache/loops/bin

.PHONY: help
help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-16s %s\n", $$1, $$2}'

.PHONY: build
build: ## Build the loops binary into ./bin/loops
	$(GO) build -o bin/loops ./cmd/loops

.PHONY: test
test: check test-race test-go-engine test-jobs-sandbox fuzz-ci test-e2e test-console test-failover test-clients test-torch test-ray test-export test-sdk-matrix test-cookbook test-recipes test-large ## Everything CI runs

.PHONY: test-go
test-go: weed grpcurl promtool ## The fast path: Go unit, contract and fuzz-seed tests (no Python)
	$(GO) test -count=1 ./...

# The packages test-race leaves out: the CPU engine's numerics and the worker server around
# it (their tests are long single-threaded kernels, ~8× slower under -race and with little
# to find there) and the benchmarks' smoke tests; test-go-engine runs them without it.
# Between them, test-race and test-go-engine run every package once (what make test does).
RACE_EXCLUDED := -e /backends/reference -e /backends/tiny -e /backends/serve -e /bench/

.PHONY: test-race
test-race: weed grpcurl promtool ## Go tests with -race and the lock-order check (-tags lockorder) on every package but the engine's numerics
	$(GO) test -count=1 -timeout 30m -race -tags lockorder $$($(GO) list ./... | grep -v $(RACE_EXCLUDED))

.PHONY: test-go-engine
test-go-engine: weed ## The Go packages test-race leaves out, without -race
	$(GO) test -count=1 $$($(GO) list ./... | grep $(RACE_EXCLUDED))

.PHONY: test-jobs-sandbox
test-jobs-sandbox: ## The jobs sandbox's escape tests (remount, writes outside /job, other jobs' and the owner's files, TIOCSTI, fork bomb, tmpfs memory, disk) with the gateway as root and as nobody
	bash scripts/test-jobs-sandbox.sh

.PHONY: test-large
test-large: weed ## Slower Go tests kept out of test-go: a Qwen3-0.6B-shaped rank-32 checkpoint (242 MB) through the core into S3 and back; a minute of load_weights of evicted runs against the eviction sweep
	LOOPS_TEST_LARGE=1 $(GO) test -count=1 -run 'Large' ./gateway/core/
	LOOPS_TEST_LARGE=1 $(GO) test -count=1 -run '^TestLoadWeightsOfEvictedRunsUnderEviction$$' ./gateway/

# grpcurl, which the gateway's TestGrpcurl drives, built from its Go module once per machine
# into ~/.cache/loops/bin/grpcurl-VERSION (the version is internal/grpcurltest's); the test
# builds it itself if need be, this only does it before the Go tests start.
.PHONY: grpcurl
grpcurl: ## Build grpcurl (the gRPC reflection and health test's client) into ~/.cache/loops/bin, once per version
	$(GO) test -count=1 -run '^TestBinary$$' ./internal/grpcurltest

# promtool, which deploy's TestAlertRules runs on deploy/prometheus/alerts.yaml, built from
# the github.com/prometheus/prometheus module once per machine into
# ~/.cache/loops/bin/promtool-VERSION (the version is internal/promtooltest's); the test
# builds it itself if need be, this only does it before the Go tests start.
.PHONY: promtool
promtool: ## Build promtool (the alert rules' checker) into ~/.cache/loops/bin, once per version
	$(GO) test -count=1 -timeout 40m -run '^TestBinary$$' ./internal/promtooltest

.PHONY: weed
weed: ## Build SeaweedFS's weed (the S3 server of the checkpoint store tests) into ~/.cache/loops/bin, once per version
	@if [ ! -x $(WEED_DIR)/weed-$(WEED_VERSION) ]; then \
	  echo "building $(WEED_MODULE)/weed@$(WEED_VERSION) into $(WEED_DIR) (several minutes, once per machine)"; \
	  dir=$$(cd / && GOFLAGS=-mod=mod $(GO) mod download -json $(WEED_MODULE)@$(WEED_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$$/\1/p'); \
	  test -d "$$dir" || { echo "cannot download $(WEED_MODULE)@$(WEED_VERSION)"; exit 1; }; \
	  mkdir -p $(WEED_DIR) && \
	  (cd "$$dir" && GOFLAGS=-mod=readonly $(GO) build -trimpath -ldflags=-s -o $(WEED_DIR)/weed-$(WEED_VERSION).tmp ./weed) && \
	  mv $(WEED_DIR)/weed-$(WEED_VERSION).tmp $(WEED_DIR)/weed-$(WEED_VERSION); \
	fi
	@ln -sfn weed-$(WEED_VERSION) $(WEED_DIR)/weed

.PHONY: fuzz-ci
fuzz-ci: ## Every Go fuzz target for a fixed budget (10 s each, the core-through-engine target 60 s)
	FUZZTIME=10s FUZZTIME_FuzzCore=60s bash scripts/fuzz.sh

.PHONY: fuzz
fuzz: ## Every Go fuzz target for longer (FUZZTIME, default 5 min each)
	FUZZTIME=$${FUZZTIME:-5m} bash scripts/fuzz.sh

.PHONY: conformance-skyrl
conformance-skyrl: ## `loops conformance` against SkyRL's Tinker server (PyPI, JAX on CPU) and loops serve side by side; writes docs/conformance-skyrl.md (not in `make test`: its own venv, 10-15 min)
	bash tests/skyrl/run.sh

.PHONY: bench-llamacpp
bench-llamacpp: ## Benchmark, not in `make test`: Loops' OpenAI route against llama.cpp's llama-server (built from the llama-cpp-python sdist once, ~/.cache/loops/llama.cpp) on a Qwen3-0.6B-shaped model, and forward_backward/sampling against PyTorch (bench/llamacpp; BENCH_ARGS, e.g. "--rounds 5")
	$$(bash scripts/pyenv.sh torch-worker $$(cat backends/torch/requirements-cpu.txt))/bin/python bench/llamacpp/compare.py --train $(BENCH_ARGS)

.PHONY: check
check: checkgenerate lint breaking ## gofmt, go vet, buf lint, buf format, buf breaking and generated-code drift

.PHONY: test-e2e
test-e2e: ## The end-to-end suite with the real tinker SDK (cached venv; torch for forward_backward_custom)
	LOOPS_E2E_TORCH=1 bash tests/e2e/run.sh

.PHONY: test-console
test-console: ## The web console in a real browser (Debian's chromium, headless, via chromedp) while a tinker script trains; prints where its screenshots are
	$(GO) vet -tags console ./tests/console/
	bash tests/console/run.sh

.PHONY: test-failover
test-failover: ## Two loops serve on one throwaway PostgreSQL behind HAProxy; a tinker script trains through it while the leader is killed -9 (tests/failover)
	$(GO) test -tags failover -count=1 -v -timeout 15m -run TestTinkerScriptSurvivesLeaderKill ./tests/failover/

.PHONY: protodeps
protodeps: ## Copy third-party protos from the Go module cache into .cache/protodeps
	@dir=$$($(GO) mod download -json $(GOOGLEAPIS_MODULE) | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'); \
	test -n "$$dir" || { echo "cannot download $(GOOGLEAPIS_MODULE)"; exit 1; }; \
	mkdir -p $(PROTODEPS)/googleapis/google/api; \
	for f in annotations.proto http.proto; do \
	  install -m 0644 "$$dir/third_party/googleapis/google/api/$$f" $(PROTODEPS)/googleapis/google/api/$$f; \
	done; \
	(cd $(PROTODEPS)/googleapis && sha256sum -c --quiet "$(CURDIR)/tools/protodeps.sha256")

.PHONY: generate
generate: protodeps ## Regenerate gen/ from proto/
	$(TOOLS) buf format -w proto
	$(TOOLS) buf lint
	rm -rf gen/go gen/openapi/*.json
	$(TOOLS) buf generate
	$(GO) fmt ./gen/... >/dev/null

.PHONY: checkgenerate
checkgenerate: generate ## Fail if gen/ is out of date with proto/
	@test -z "$$(git status --porcelain -- gen proto)" || { git status --porcelain -- gen proto; echo "gen/ is stale: run make generate and commit"; exit 1; }

.PHONY: lint
lint: protodeps ## gofmt, go vet, errorlint, buf lint, buf format check
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); test -z "$$out" || { echo "gofmt needed: $$out"; exit 1; }
	$(GO) vet ./...
# errorlint's default checks (== and type assertions on errors miss wrapped ones); -errorf off: whether to wrap with %w is a deliberate API choice at each boundary.
	$(TOOLS) go-errorlint -errorf=false ./...
	$(TOOLS) buf lint
	$(TOOLS) buf format -d --exit-code proto

# The tree buf breaking compares against (a git revision).
BREAKING_AGAINST ?= main

.PHONY: breaking
breaking: protodeps ## buf breaking against $(BREAKING_AGAINST) (WIRE_JSON for every proto, the stricter of the two rules DESIGN.md names)
	@rm -rf .cache/against && mkdir -p .cache/against/.cache
	@git archive $(BREAKING_AGAINST) | tar -x -C .cache/against
	@cp -r $(PROTODEPS) .cache/against/.cache/
	$(TOOLS) buf breaking --against .cache/against

.PHONY: generate-ts
generate-ts: protodeps ## Regenerate gen/ts (TypeScript for loops.v1) with buf and the npm-pinned protoc-gen-es
	bash clients/ts/generate.sh

.PHONY: test-clients
test-clients: protodeps ## Generated TypeScript (Connect) and Python (gRPC) clients: stubs current, SFT loop + sample against loops serve; the official openai and anthropic clients and curl on /oai/api/v1 and /anthropic/api (tool loops and structured outputs on the reference engine and the torch worker); lm-evaluation-harness (local-completions with loglikelihood tasks, local-chat-completions) on a deployed checkpoint, checked against transformers
	bash clients/ts/run.sh
	bash clients/python/run.sh
	bash clients/openai/run.sh
	bash clients/anthropic/run.sh
	bash clients/curl/run.sh
	bash clients/lmeval/run.sh

.PHONY: test-ray
test-ray: ## Worker pools on a real local Ray cluster (5 raylets, logical GPUs, CPU workers): tinker trains and samples while the pool scales 1→3→1 and an actor, then a raylet, is killed; a 2-rank replica spans two raylets and survives one being killed (cached venv with ray[default]; ~5 min warm)
	bash tests/ray/run.sh

.PHONY: test-torch
test-torch: ## The torch worker: Python tests, then the Go worker client tests incl. the backend contract suite against a local CPU worker (cached venv)
	bash backends/torch/run-tests.sh

.PHONY: test-export
test-export: ## Checkpoint export and import against transformers + PEFT (torch-worker venv): merged exports load offline with logits within 1e-4 (float32); a PEFT adapter imported samples as PEFT does; POST /embeddings of loops/tiny is transformers' mean last hidden state within 1e-5; the reference engine's Gemma 3 and Qwen3-MoE against transformers + PEFT (log-probs, LoRA gradients, a saved adapter in PEFT)
	set -o pipefail; venv=$$(scripts/pyenv.sh torch-worker $$(cat backends/torch/requirements-cpu.txt)) && \
	  HF_HUB_OFFLINE=1 LOOPS_TORCH_PYTHON=$$venv/bin/python $(GO) test -count=1 -v -run '^(TestExport|TestImport)$$' ./gateway/ | grep -E '^(=== RUN|\s*--- |ok|FAIL|PASS)|max_abs_diff|imported PEFT adapter' && \
	  HF_HUB_OFFLINE=1 LOOPS_TORCH_PYTHON=$$venv/bin/python $(GO) test -count=1 -v -run '^TestEmbeddings$$' ./compat/openai/ | grep -E '^(=== RUN|\s*--- |ok|FAIL|PASS)|max_abs_diff' && \
	  HF_HUB_OFFLINE=1 LOOPS_TORCH_PYTHON=$$venv/bin/python $(GO) test -count=1 -v -run '^(TestGemma3Transformers|TestQwen3MoeTransformers)$$' ./backends/reference/nn/ | grep -E '^(=== RUN|\s*--- |ok|FAIL|PASS)|max \|Δ\|'

.PHONY: test-sdk-matrix
test-sdk-matrix: ## Real tinker SDK releases (0.18.2, 0.24.1, 0.30.4, 0.38.0) × features; writes tests/sdk_matrix/MATRIX.md
	bash tests/sdk_matrix/run.sh

.PHONY: test-sdk-surface
test-sdk-surface: ## Every method/argument of tinker 0.18.2, 0.24.1, 0.30.4, 0.38.0 (found by introspection) called against loops serve; writes tests/sdk_matrix/SURFACE.md
	LOOPS_SDK_TESTS=tests/sdk_matrix/test_surface.py bash tests/sdk_matrix/run.sh

.PHONY: test-cookbook
test-cookbook: ## tinker-cookbook 0.6.1 recipes (chat_sl, math_rl sync/async/stream × IS/PPO/CISPO, rl_loop with gspo and its default stable_reinforce) unmodified against loops serve; its weights tools (build_hf_model, build_lora_adapter, publish_to_hf_hub) on checkpoints downloaded with the tinker CLI, per family
	bash tests/cookbook/run.sh

.PHONY: test-recipes
test-recipes: ## Our cookbook (cookbook/) on loops/tiny: learning shown (SFT, RL sync/async, DPO), agent recipes with real sandboxes, loops cookbook check/run
	bash tests/recipes/run.sh
