# Convenience targets; the scripts are the commands of record.
.PHONY: serve bench bench-smoke test

serve:
	cargo build --release -p app -p supervisor && ./target/release/sandlane serve

bench:
	bash scripts/bench.sh

bench-smoke:
	bash scripts/bench.sh --smoke

test:
	bash scripts/test.sh
