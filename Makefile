# Thin wrapper over CMake presets. `make run` and `make test` work on a fresh Debian 12 machine:
# both run scripts/setup first (idempotent; quick when everything is installed).
JOBS ?= $(shell nproc)

.PHONY: all setup build build-asan build-tsan run run-generate test test-default test-asan test-tsan \
	bench bench-serve format clean fuzz-build fuzz-smoke

all: build

setup:
	@scripts/setup

build: setup
	cmake --preset default
	cmake --build --preset default -j $(JOBS)

build-asan: setup
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)

# The product on the built-in default: `kvguard serve` on 127.0.0.1:8080 (admin API and /metrics
# on 127.0.0.1:8081) with the `small` model (FP8 prefill weights, INT4 decode weights, FP8 KV
# cache), two demo tenants (demo-a enforce, demo-b strict) whose keys are printed once, when
# build/demo/tenants.json is created (delete it for new keys), and the audit log in
# build/demo/audit. Ctrl-C (SIGINT) or SIGTERM shuts it down gracefully.
KVGUARD = ./build/default/tools/kvguard
DEMO = build/demo
run: build
	$(KVGUARD) version
	mkdir -p $(DEMO)
	$(KVGUARD) serve --model small --host 127.0.0.1 --port 8080 --admin-port 8081 \
	  --demo-tenants $(DEMO)/tenants.json --audit-log $(DEMO)/audit \
	  --tag-key-file $(DEMO)/tag.key --kv-cache-bytes 512M

# The previous main job: generate with `small`, then a short serving benchmark (engine only).
run-generate: build
	$(KVGUARD) generate --model small --prompt "Once upon a time" --max-tokens 48
	$(KVGUARD) bench --model small --context 256 --concurrency 1,4,16 \
	  --configs int4/fp8_e4m3,int4/bf16 --requests-per-client 1

# Every test: the default preset's suite, the same suite under ASan + UBSan, then the
# multi-threaded suites (thread pool, engine, isolation) under ThreadSanitizer.
TSAN_TESTS = thread_pool_test engine_test engine_isolation_test ownership_table_test \
	isolation_stress_test tag_key_test guard_test log_test audit_log_sink_test \
	session_pages_stress_test
TSAN_SUITES = ThreadPoolTest|EngineTest|EngineIsolationTest|OwnershipTableTest|IsolationStressTest|TagKeyTest|GuardTest|GuardModeChangeTest|AuditLogTest|AuditLogSinkTest|SessionPagesStressTest
test: test-default test-asan test-tsan

test-default: build
	ctest --preset default -j $(JOBS)

test-asan: build-asan
	ctest --preset asan -j $(JOBS)

build-tsan: setup
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS) --target $(TSAN_TESTS)

test-tsan: build-tsan
	ctest --preset tsan -j $(JOBS) -R '^($(TSAN_SUITES))\.'

# Fuzzing (fuzz/README.md): the libFuzzer targets (clang, ASan + UBSan), then the smoke pass CI
# runs: every target FUZZ_SECONDS from its seed corpus (any crash fails), and the planted-bug
# check with one seed (each planted bug found within 60 s, the real build finds nothing).
FUZZ_SECONDS ?= 30
fuzz-build: setup
	scripts/fuzz-campaign build

fuzz-smoke: fuzz-build
	scripts/fuzz-campaign run --seconds $(FUZZ_SECONDS) --parallel $(JOBS) --no-merge \
	  --out build/fuzz-smoke
	scripts/fuzz-campaign planted --seeds 1 --budget 60 --parallel $(JOBS) --no-real --check \
	  --out build/fuzz-smoke

# The recorded benchmark runs (bench/results/): kernels, the serving experiment, quality.
bench: build
	$(KVGUARD) bench kernels --markdown bench/results/kernels.md --json bench/results/kernels.json
	$(KVGUARD) bench --out bench/results/engine
	$(KVGUARD) eval --out bench/results/eval
	$(KVGUARD) bench --isolation off,enforce,strict --model small --concurrency 1,16,64 \
	  --rounds 5 --out bench/results/isolation
	./build/default/bench/isolation_bench --benchmark_min_time=0.5 --benchmark_repetitions=5 \
	  --benchmark_report_aggregates_only=true > bench/results/isolation-tag-derivation.txt
	./build/default/bench/audit_bench --benchmark_repetitions=3 \
	  --benchmark_report_aggregates_only=true > bench/results/audit-bench.txt

# The bounded load test of `kvguard serve`: 64 clients over 4 tenants for 60 s on `small`
# (throughput, p50/p99 latency, zero lost and zero wrong-tenant responses).
bench-serve: build
	.venv/bin/python bench/serve_load.py --kvguard $(KVGUARD) --model small --clients 64 \
	  --duration 60 --out bench/results/serve-load

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.cu')

clean:
	rm -rf build
