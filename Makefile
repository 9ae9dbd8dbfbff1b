# wgrad: the two commands that do all set-up on a fresh machine are `make test` and `make demo`.
export XDG_RUNTIME_DIR ?= /tmp
CARGO ?= cargo

.PHONY: setup test demo check bench fmt lint msl

setup:
	@bash scripts/setup.sh

## Every test: unit, integration (GPU against f64 references), examples and benches built and
## run once in test mode, doctests.
test: setup
	$(CARGO) test --all-targets
	$(CARGO) test --doc

## The demo: the gradient-check report of every operator on this machine's adapter.
demo: setup
	$(CARGO) run --release --example check

check: demo

## Benchmarks with GPU timestamps (add ARGS=--quick on a software adapter).
bench: setup
	$(CARGO) run --release --example bench -- $(ARGS)

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

## Print the strict MSL of one kernel entry point: make msl KERNEL=reduce ENTRY=row_sum
msl:
	$(CARGO) run -q --example msl -- $(KERNEL) $(ENTRY)
