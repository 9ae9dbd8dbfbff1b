# wgrad: the commands that do all set-up on a fresh machine are `make test`, `make demo` and `make check`.
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

## The demo: train a small character-level transformer on the bundled sonnets (about a
## minute on a 2-core CPU adapter); loss curve and CSV in out/train/ (ARGS=--help for flags).
demo: setup
	$(CARGO) run --release --example train -- $(ARGS)

## The gradient-check report of every operator on this machine's adapter.
check: setup
	$(CARGO) run --release --example check

## Benchmarks with GPU timestamps (add ARGS=--quick on a software adapter).
bench: setup
	$(CARGO) run --release --example bench -- $(ARGS)

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps

## Print the strict MSL of one kernel entry point: make msl KERNEL=reduce ENTRY=row_sum
msl:
	$(CARGO) run -q --example msl -- $(KERNEL) $(ENTRY)
