# Convenience targets; the scripts are the commands of record.
.PHONY: bench bench-smoke test

bench:
	bash scripts/bench.sh

bench-smoke:
	bash scripts/bench.sh --smoke

test:
	bash scripts/test.sh
