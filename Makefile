# redis-rl: native rate-limit commands for Redis.
PORT ?= 6379
MODULE := $(CURDIR)/target/release/libredis_rl.so

.PHONY: help deps gateway-deps build run lint bench-worst test test-loaded test-compat test-examples fuzz-commands fuzz valgrind demo bench bench-cost bench-node bench-sidebyside bench-gateway clean replay-demo bench-replay

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

deps: ## Install redis-server and libclang when missing (apt-get, as root or via sudo)
	@scripts/install-deps.sh

gateway-deps: ## nginx and Caddy (Debian's packages) for the gateway's proxy tests, when missing
	@scripts/install-deps.sh nginx caddy

build: deps ## Build the module: target/release/libredis_rl.so
	cargo build --release

run: build ## Start redis-server on 127.0.0.1:$(PORT) in the foreground with the module
	redis-server --port $(PORT) --bind 127.0.0.1 --save "" --appendonly no --loadmodule $(MODULE)

lint: deps ## Formatting and clippy gates (warnings are errors; every unsafe block documented), gofmt, go vet and staticcheck for clients/go, its Lua copy current, tsc --noEmit (strict) and prettier --check for clients/node
	cargo fmt --all --check
	cargo fmt --manifest-path fuzz/Cargo.toml --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --manifest-path fuzz/Cargo.toml -- -D warnings
	@scripts/install-deps.sh staticcheck
	cd clients/go && git ls-files --error-unmatch redis_rl.lua >/dev/null && { cmp -s ../../scripts/lua/redis_rl.lua redis_rl.lua || { echo "clients/go/redis_rl.lua differs from scripts/lua/redis_rl.lua: run go generate ./... in clients/go and commit the copy (clients/go/GENERATED.md)"; exit 1; }; } && out=$$(gofmt -l .) && { [ -z "$$out" ] || { echo "gofmt -l: $$out"; exit 1; }; } && go vet ./... && sc=$$(go env GOBIN) && sc=$${sc:-$$(go env GOPATH)/bin}/staticcheck && $$sc ./... && (cd rlgin && go vet ./... && $$sc ./...) && cd bench && go vet ./...
	cd clients/node && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && npm run --silent lint

test: deps gateway-deps ## Run every test (every suite, even after a failure); ends with "N passed, N failed, N suites not run (…)"
	@scripts/test.sh

test-loaded: deps gateway-deps ## make test with one CPU-bound process per core running beside it for the whole run (stress, or busy loops)
	@scripts/test-loaded.sh

test-compat: deps ## Run the integration suites on Redis 7.0, Valkey 8.1 and Valkey 9.1 (same module file)
	@scripts/test-compat.sh

test-examples: build ## Run the client examples and the HTTP example's end-to-end test
	@scripts/test-clients.sh

fuzz-commands: build ## Command fuzzer: 1,000,000 random RL.* commands against a real server (FUZZ_SEED=, FUZZ_COMMANDS=)
	RL_MODULE=$(MODULE) FUZZ_COMMANDS=$${FUZZ_COMMANDS:-1000000} FUZZ_SECONDS=$${FUZZ_SECONDS:-1800} \
		cargo test --test fuzz_commands -- --nocapture

fuzz: ## Coverage-guided fuzzing of the decoders and parsers (cargo-fuzz; FUZZ_TIME= seconds per target)
	@scripts/fuzz.sh

valgrind: deps ## Memcheck the module under 50,000+ mixed commands; reports bytes lost in module frames
	@scripts/valgrind.sh

demo: ## Show a burst admitted, denied, then admitted again (needs `make run` in another shell)
	@PORT=$(PORT) scripts/demo.sh

clean: ## Remove build output
	cargo clean

bench-worst: build ## Worst single-call server time of the LOG patterns (default cap and 10 M) and of the fallback's LEASE at 10,000 holders
	RL_MODULE=$(MODULE) cargo bench --profile bench-worst --bench worst_case

bench: build ## Speed, memory and instructions per call against INCR, Lua and the floor (BENCHMARKS.md), then the Python, Rust, Go and Node clients' fast paths, the Go side-by-side with redis_rate, the Node one with rate-limit-redis and rate-limiter-flexible, the Python side-by-side bench, rl-replay's and the gateway's beside envoyproxy/ratelimit (BENCH_QUICK=1 shortens)
	python3 bench/bench.py
	@[ -x .venv-py/bin/pip ] || python3 -m venv .venv-py
	.venv-py/bin/pip install -q --disable-pip-version-check ./clients/python
	.venv-py/bin/python clients/python/bench/fastpath.py $$([ -n "$${BENCH_QUICK:-}" ] && echo --seconds 1 || echo --readme)
	RL_MODULE=$(MODULE) cargo bench -p redis-rl-client --bench fastpath -- $${BENCH_QUICK:+--seconds 1}
	cd clients/go/bench && RL_MODULE=$(MODULE) go run ./fastpath $${BENCH_QUICK:+-seconds 1 -samples 2000}
	$(MAKE) bench-node
	$(MAKE) bench-sidebyside
	$(MAKE) bench-replay
	$(MAKE) bench-gateway

bench-node: build ## The Node package's fast path, and the same express app limited by rate-limit-redis, rate-limiter-flexible, redis-rl and nothing (clients/node/bench; BENCH_QUICK=1 shortens)
	cd clients/node && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && npm run build >/dev/null
	cd clients/node && RL_MODULE=$(MODULE) node bench/fastpath.mjs && RL_MODULE=$(MODULE) node bench/sidebyside.mjs

SIDE_VENV := target/bench-venv-sidebyside
bench-sidebyside: build ## The same FastAPI and Flask apps limited by redis_rl, slowapi / Flask-Limiter and nothing (own virtualenv; BENCH_QUICK=1 shortens)
	@[ -x $(SIDE_VENV)/bin/pip ] || python3 -m venv $(SIDE_VENV)
	$(SIDE_VENV)/bin/pip install -q --disable-pip-version-check -r clients/python/bench/sidebyside/requirements.txt
	$(SIDE_VENV)/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall ./clients/python
	RL_MODULE=$(MODULE) $(SIDE_VENV)/bin/python clients/python/bench/sidebyside.py $$([ -n "$${BENCH_QUICK:-}" ] && echo --quick || echo --readme)

# envoyproxy/ratelimit for bench-gateway's side-by-side: go install from the Go module proxy into
# target/ (never committed); when it does not build, the bench says why and runs ours alone.
RATELIMIT_GOBIN := $(CURDIR)/target/ratelimit-go
# The version gateway/README.md's figures were measured against (its main branch of 2026-01-22).
RATELIMIT_VERSION ?= v1.4.1-0.20260122083618-3fb702589d36
bench-gateway: build ## rl-gateway's ShouldRateLimit: decisions/s, p50/p99 with 1 and 3 descriptors, Redis calls per request, beside envoyproxy/ratelimit when it builds (BENCH_QUICK=1 shortens)
	@mkdir -p $(RATELIMIT_GOBIN)
	@[ -x $(RATELIMIT_GOBIN)/service_cmd ] || GOBIN=$(RATELIMIT_GOBIN) GOFLAGS=-mod=mod timeout 600 \
		go install github.com/envoyproxy/ratelimit/src/service_cmd@$(RATELIMIT_VERSION) >$(RATELIMIT_GOBIN)/install.log 2>&1 || true
	RL_MODULE=$(MODULE) RATELIMIT_BIN=$(RATELIMIT_GOBIN)/service_cmd \
		RATELIMIT_WHY="$$(tail -n 1 $(RATELIMIT_GOBIN)/install.log 2>/dev/null)" \
		RATELIMIT_VERSION="$$(go version -m $(RATELIMIT_GOBIN)/service_cmd 2>/dev/null | awk '$$1 == "mod" {print $$3}')" \
		cargo bench -p rl-gateway --bench shouldratelimit

bench-cost: build ## Instructions per call under callgrind: INCR, SET PX, the floor, every RL command, the Lua fallback and its reference scripts (~30 min; needs valgrind)
	python3 bench/cost.py

replay-demo: ## rl-replay on a generated sample log: summary, --suggest, pictures in target/replay-demo/
	cargo build --profile replay -p rl-replay
	@mkdir -p target/replay-demo
	target/replay/rl-loggen --lines 300000 --seed 1 > target/replay-demo/access.log
	target/replay/rl-replay target/replay-demo/access.log \
		-l 'GCRA 20 10 1 per {ip}' -l 'WINDOW 5 60 LOG per {ip} on POST /login' \
		--suggest --out-dir target/replay-demo --json target/replay-demo/report.json

bench-replay: ## rl-replay lines/s and peak memory on a generated 10M-line log; writes its section of BENCHMARKS.md
	cargo build --profile replay -p rl-replay
	python3 replay/bench/bench.py
