# One target per test tier (see docs/architecture.md); `make test` is what CI runs after .ci/setup.
PYTEST ?= python -m pytest

.PHONY: test test-unit test-builder test-engine lint

test:
	$(PYTEST)

test-unit:  # offline, no engine: seconds
	$(PYTEST) tests/unit

test-builder:  # real sdists, torch and nvcc; the network once
	$(PYTEST) tests/builder

test-engine:  # a real Docker Engine and Podman, started privately as root
	$(PYTEST) tests/engine

lint:
	ruff check .
	ruff format --check .
	mypy
	shellcheck .ci/* bench/*.sh bench/gpu_container/*.sh
