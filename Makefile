# Every target creates and reuses .venv itself: `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test lint bench clean proto

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/nvdaemon run $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check nvdaemon tests bench
	$(BIN)/ruff format --check nvdaemon tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

# NVSentinel stubs, committed; the -I mapping makes them importable as nvdaemon.proto.health_event_pb2.
# tests/nvsentinel/test_proto.py runs the same command and fails when the committed files differ.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Invdaemon/proto=protos --python_out=. --pyi_out=. --grpc_python_out=. \
		nvdaemon/proto/health_event.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
