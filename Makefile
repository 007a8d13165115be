# meshfast — one Makefile for setup, build, test, lint, bench.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8080
WORKERS ?= 2

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

.PHONY: setup
setup: $(BIN)/python ## create .venv, install pinned dependencies and build meshfast (release, thin LTO)
	$(BIN)/pip install -q -r requirements-lock.txt
	$(BIN)/pip install -q --no-deps --force-reinstall .
	$(MAKE) --no-print-directory core-in-tree
	@if command -v npm >/dev/null; then cd tests/node && npm ci --no-audit --no-fund --silent; fi

.PHONY: build
build: $(BIN)/python ## rebuild and reinstall the Rust core and the package
	$(BIN)/pip install -q --no-deps --force-reinstall .
	$(MAKE) --no-print-directory core-in-tree

# The bench scripts and the forwarder import meshfast from the working tree (granian runs them
# from it): the built extension is placed beside the sources too (a new file, then a rename, so a
# running process keeps the one it mapped).
.PHONY: core-in-tree
core-in-tree:
	@so=$$(ls $(VENV)/lib/python3*/site-packages/meshfast/_core*.so | head -1); \
		cp "$$so" meshfast/.core-tmp.so && mv meshfast/.core-tmp.so "meshfast/$$(basename $$so)"

.PHONY: run
run: setup ## set up and run the gateway on $(PORT) with $(WORKERS) workers
	$(BIN)/meshfast serve --host 127.0.0.1 --port $(PORT) --workers $(WORKERS) --demo

.PHONY: test
test: setup ## set up and run every test: Rust unit tests, Python tests, benchmark gates
	cargo test --release --locked -p meshfast-core
	PYTHONSAFEPATH=1 $(BIN)/python -m mypy.stubtest meshfast._core
	@# The fuzz targets' sanitizer build, niced, beside the Python tests (which mostly wait on
	@# sockets and subprocesses); fuzz-quick below runs them once it is done (cargo's build lock).
	@mkdir -p target; if cargo +nightly --version >/dev/null 2>&1; then \
		(nice -n 19 $(MAKE) --no-print-directory fuzz-build > target/fuzz-build.log 2>&1 &) ; fi
	PYTHONSAFEPATH=1 $(BIN)/python -m pytest -q --durations=30 tests
	PYTHONSAFEPATH=1 $(BIN)/python -m pytest -q tests/bench --benchmark-only --benchmark-disable-gc
	$(MAKE) instructions
	$(MAKE) fuzz-quick

.PHONY: test-rust
test-rust: ## Rust unit and property tests only
	cargo test --release --locked -p meshfast-core

.PHONY: test-py
test-py: ## Python tests only (assumes `make setup`)
	PYTHONSAFEPATH=1 $(BIN)/python -m pytest -q --durations=30 tests

.PHONY: bench-gates
bench-gates: ## pytest-benchmark gates on the in-process path
	PYTHONSAFEPATH=1 $(BIN)/python -m pytest -q tests/bench --benchmark-only --benchmark-disable-gc
	$(MAKE) instructions

.PHONY: instructions
instructions: ## instruction counts of the core's hot functions (callgrind) against bench/instructions-baseline.json
	@command -v valgrind >/dev/null || { echo "instructions: valgrind missing (apt-get install valgrind)"; exit 1; }
	$(BIN)/python bench/instructions.py

.PHONY: bench
bench: setup ## authenticated GET /v1/models vs a Granian hello-world, with wrk (needs wrk)
	@command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk"; exit 1; }
	$(BIN)/python bench/models_bench.py --workers $(WORKERS) --rounds 3 --meshfast-cmd $(BIN)/meshfast

.PHONY: bench-slowbody
bench-slowbody: setup ## valid callers' latency before, during and after 2,000 stalled request bodies (--quick: QUICK=1)
	$(BIN)/python bench/slowbody_bench.py --workers $(WORKERS) --meshfast-cmd $(BIN)/meshfast $(if $(QUICK),--quick)

# The compiled forwarder and the alternative event loops are bench tools only: built/installed under
# target/ (ignored), never in the package or requirements-lock.txt.
FORWARDER_RS := target/bench-forwarder/release/forwarder-rs
BENCH_LOOPS := rloop==0.5.0
FLOOR_ARGS = --workers $(WORKERS) $(if $(QUICK),--quick) $(if $(LOOP),--loop $(LOOP)) \
	$(if $(TASK_IMPL),--task-impl $(TASK_IMPL)) $(if $(RUNTIME_MODE),--runtime-mode $(RUNTIME_MODE))

.PHONY: bench-forwarder
bench-forwarder: ## build the compiled forwarder (bench/forwarder-rs: hyper, pooled client), the floor of bench-floor
	cargo build --locked --release --manifest-path bench/forwarder-rs/Cargo.toml --target-dir target/bench-forwarder

.PHONY: bench-offloop
bench-offloop: $(BIN)/python ## build the off-loop upstream client (bench/offloop-rs, PyO3 + hyper) of bench-floor's rs-offloop target
	PYO3_PYTHON=$(CURDIR)/$(BIN)/python cargo build --locked --release --manifest-path bench/offloop-rs/Cargo.toml --target-dir target/bench-offloop
	mkdir -p target/bench-offloop/py && cp target/bench-offloop/release/liboffloop_rs.so target/bench-offloop/py/.tmp.so \
		&& mv target/bench-offloop/py/.tmp.so target/bench-offloop/py/offloop_rs.abi3.so

.PHONY: bench-loops
bench-loops: $(BIN)/python ## rloop into target/bench-loops for bench-floor --loop rloop (not a dependency; uvloop is one)
	$(BIN)/pip install -q --target target/bench-loops $(BENCH_LOOPS)

.PHONY: bench-floor
bench-floor: setup bench-forwarder bench-offloop ## side by side on nginx: direct, compiled/Python forwarders, hello, meshfast (QUICK=1 LOOP= TASK_IMPL= RUNTIME_MODE=)
	@command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk"; exit 1; }
	@command -v nginx >/dev/null || { echo "nginx missing: apt-get install -y nginx"; exit 1; }
	$(if $(filter rloop,$(LOOP)),$(MAKE) --no-print-directory bench-loops)
	$(BIN)/python bench/floor_bench.py $(FLOOR_ARGS) --meshfast-cmd $(BIN)/meshfast

.PHONY: bench-cache
bench-cache: setup ## prompt-cache shaping: a multi-turn agent trace with and without shaping, cost and hit rate (QUICK=1)
	$(BIN)/python bench/cache_bench.py --workers $(WORKERS) --meshfast-cmd $(BIN)/meshfast $(if $(QUICK),--quick)

.PHONY: bench-identity
bench-identity: setup ## authentication cost: a key vs platform tokens (RS256/ES256/EdDSA) in process and on the proxy path (QUICK=1; needs nginx)
	$(BIN)/python bench/identity_bench.py --workers $(WORKERS) --meshfast-cmd $(BIN)/meshfast $(if $(QUICK),--quick)

.PHONY: bench-dlp
bench-dlp: setup ## data protection: the scanner's MB/s on bench/dlp-corpus.txt (its instruction count is a `make instructions` workload), and the proxy path's latency with a policy on vs off for 1/32/512 KB prompts (QUICK=1; needs nginx)
	PYTHONSAFEPATH=1 $(BIN)/python bench/dlp_bench.py --proxy --workers $(WORKERS) --meshfast-cmd $(BIN)/meshfast $(if $(QUICK),--quick)

.PHONY: bench-realtime
bench-realtime: setup ## realtime sessions: a response's time direct to testserve vs through meshfast's relay, and session set-up (QUICK=1)
	$(BIN)/python bench/realtime_bench.py --workers $(WORKERS) --meshfast-cmd $(BIN)/meshfast $(if $(QUICK),--quick)

.PHONY: bench-rules
bench-rules: setup ## spend rules: oversubscription (no overshoot), decision cost, proxy with/without 100 rules, shm size (QUICK=1)
	@command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk"; exit 1; }
	@command -v nginx >/dev/null || { echo "nginx missing: apt-get install -y nginx"; exit 1; }
	$(BIN)/python bench/rules_bench.py --workers $(WORKERS) --meshfast-cmd $(BIN)/meshfast $(if $(QUICK),--quick)

.PHONY: bench-cluster
bench-cluster: setup ## scale-out: lone vs 3-instance cluster on one PostgreSQL: latency, CPU, DB round trips, lease return (QUICK=1)
	@command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk"; exit 1; }
	@command -v nginx >/dev/null || { echo "nginx missing: apt-get install -y nginx"; exit 1; }
	$(BIN)/python bench/cluster_bench.py --workers $(WORKERS) --meshfast-cmd $(BIN)/meshfast $(if $(QUICK),--quick)

# One bench-floor per runtime, shorter phases; the last command prints them side by side. Not rloop:
# rloop 0.5.0 has no create_unix_connection, so meshfast's workers cannot reach the embedded PostgreSQL.
# "" is the default: uvloop for meshfast and for every other Granian server (Granian's auto).
RUNTIMES := "" "--loop asyncio" "--task-impl rust" "--loop asyncio --task-impl rust" "--runtime-mode mt" \
	"--workers 1" "--workers 4"

.PHONY: bench-runtimes
bench-runtimes: setup bench-forwarder ## bench-floor per Granian runtime (loop, task impl, runtime mode, workers per core)
	@command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk"; exit 1; }
	@command -v nginx >/dev/null || { echo "nginx missing: apt-get install -y nginx"; exit 1; }
	@rm -f bench/results/tmp/runtimes.list; mkdir -p bench/results/tmp
	@for rt in $(RUNTIMES); do \
		out=bench/results/floor-$$(date -u +%Y%m%dT%H%M%SZ)-rt.json; echo "$$out" >> bench/results/tmp/runtimes.list; \
		$(BIN)/python bench/floor_bench.py --workers $(WORKERS) --b2b-rounds 2 --b2b-duration 2 --duration 5 \
			--wrk-duration 5 --wrk-warmup 1 --meshfast-cmd $(BIN)/meshfast --out $$out $$rt || exit 1; done
	$(BIN)/python bench/floor_bench.py --compare $$(cat bench/results/tmp/runtimes.list)

.PHONY: build-bench
build-bench: $(BIN)/python ## build the core with the fat-LTO bench profile for published numbers
	MATURIN_PEP517_ARGS="--profile bench-release" MESHFAST_BUILD_PROFILE=bench-release \
		$(BIN)/pip install -q --no-deps --force-reinstall .

# The release's wheels: one abi3 wheel (CPython 3.11 and later) per target, manylinux_2_28, cross
# built with zig (no container); the tools at pinned versions.
WHEEL_TARGETS ?= x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu
WHEEL_TOOLS = ziglang==0.17.1 auditwheel==6.8.2 twine==7.0.0

.PHONY: print-wheel-tools
print-wheel-tools:
	@echo $(WHEEL_TOOLS)

.PHONY: wheel
wheel: $(BIN)/python ## dist/: an abi3 manylinux_2_28 wheel per WHEEL_TARGETS (x86_64, aarch64; maturin + zig) and the sdist, checked by auditwheel and twine
	$(BIN)/pip install -q $(WHEEL_TOOLS)
	rm -rf dist
	for target in $(WHEEL_TARGETS); do \
		rustup target list --installed 2>/dev/null | grep -qx $$target || rustup target add $$target; \
		PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/maturin build --release --zig --compatibility manylinux_2_28 --target $$target \
			-F python,pyo3/abi3-py311 -o dist || exit 1; \
	done
	$(BIN)/maturin sdist -o dist
	for wheel in dist/*.whl; do $(BIN)/auditwheel show $$wheel || exit 1; done
	$(BIN)/twine check dist/*

.PHONY: wheel-smoke
wheel-smoke: ## the x86_64 wheel (built here) in a clean virtualenv outside the repository: install, serve the demo, one call (CI)
	$(MAKE) --no-print-directory wheel WHEEL_TARGETS=x86_64-unknown-linux-gnu
	$(MAKE) --no-print-directory wheel-smoke-built

.PHONY: wheel-smoke-built
wheel-smoke-built: ## wheel-smoke on the x86_64 wheel already in dist/ (CI builds it beside the tests)
	$(BIN)/python server/wheel_smoke.py dist/meshfast-*-manylinux_2_28_x86_64.whl

.PHONY: lint
lint: ## ruff, mypy (the package, strict; pyproject.toml), cargo fmt --check, clippy and the stub check (CI runs it)
	$(BIN)/ruff check meshfast testserve tests bench paper
	PYTHONSAFEPATH=1 $(BIN)/python -m mypy
	cargo fmt --all --check
	cargo clippy --locked -p meshfast-core --all-targets --features python -- -D warnings
	PYTHONSAFEPATH=1 $(BIN)/python -m mypy.stubtest meshfast._core

.PHONY: stubtest
stubtest: ## check meshfast/_core.pyi against the built module
	$(BIN)/python -m mypy.stubtest meshfast._core

.PHONY: flood
flood: ## a bad-key flood of a million requests: every denial must be in the logs
	FLOOD_REQUESTS=1000000 PYTHONSAFEPATH=1 $(BIN)/python -m pytest -q -s tests/test_flood.py

.PHONY: rules-shadow
rules-shadow: ## spend rules in shadow mode: 0 denials over 10,000 calls (CI runs 1,000)
	RULES_SHADOW_CALLS=10000 PYTHONSAFEPATH=1 $(BIN)/python -m pytest -q tests/test_rules.py -k shadow_rule

.PHONY: soak
soak: ## a million mixed requests, worker RSS sampled every second: the leak rate
	$(BIN)/python bench/soak.py --requests 1000000 --workers $(WORKERS)

.PHONY: paper
paper: setup bench-forwarder bench-offloop ## every paper scenario (~28 min on 2 cores), figures, paper/meshfast.pdf (needs wrk, node, npm)
	@command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk"; exit 1; }
	$(BIN)/python bench/paper.py --workers $(WORKERS)

.PHONY: paper-quick
paper-quick: bench-forwarder bench-offloop ## the paper pipeline shortened (~5 min); outputs in bench/results/tmp/paper-quick/
	@command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk"; exit 1; }
	$(BIN)/python bench/paper.py --quick --workers $(WORKERS) --run-dir bench/results/tmp/paper-quick

.PHONY: paper-figures
paper-figures: ## redraw figures and the PDF from a run: make paper-figures RUN=bench/results/paper-<ts>
	$(BIN)/python bench/paper.py --figures-only $(RUN)

FUZZ_TARGETS := http1_response sse_stream translate template dlp
FUZZ_SECONDS ?= 150

.PHONY: fuzz
fuzz: ## libFuzzer on the core's parsers (nightly + cargo-fuzz), FUZZ_SECONDS each (default: 10 min in all)
	@cargo +nightly --version >/dev/null 2>&1 || { echo "fuzz: needs a nightly toolchain (rustup toolchain install nightly)"; exit 1; }
	@command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
	cd core && for t in $(FUZZ_TARGETS); do \
		cargo +nightly fuzz run -O $$t -- -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 || exit 1; done

.PHONY: fuzz-build
fuzz-build: ## build the fuzz targets (nightly, address sanitizer, as `fuzz` runs them) without running them
	@cargo +nightly --version >/dev/null 2>&1 || { echo "fuzz-build: needs a nightly toolchain"; exit 1; }
	@command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
	cd core && cargo +nightly fuzz build -O

.PHONY: fuzz-admin
fuzz-admin: ## schemathesis on the admin API, FUZZ_EXAMPLES per operation (default 300; CI runs 15); FUZZ_SEED repeats a run
	MESHFAST_FUZZ_EXAMPLES=$(or $(FUZZ_EXAMPLES),300) MESHFAST_FUZZ_SEED=$(FUZZ_SEED) PYTHONSAFEPATH=1 \
		$(BIN)/python -m pytest -q tests/test_openapi.py tests/test_hardening_input.py

.PHONY: fuzz-quick
fuzz-quick: ## a short fuzz run of every target (CI); skipped without a nightly toolchain
	@if cargo +nightly --version >/dev/null 2>&1; then $(MAKE) fuzz FUZZ_SECONDS=10; \
	else echo "fuzz-quick: no nightly toolchain, skipped (the Hypothesis parser tests still ran)"; fi

.PHONY: lock
lock: $(BIN)/python ## refresh requirements-lock.txt from the current environment
	# NOTE: --all keeps setuptools, which hdrhistogram needs at run time (>= 83).
	$(BIN)/pip freeze --all --exclude meshfast --exclude pip > requirements-lock.txt

.PHONY: clean
clean: ## remove build outputs
	rm -rf target build dist $(VENV) .pytest_cache .hypothesis .benchmarks bench/baselines/litellm/.venv bench/baselines/portkey/node_modules
