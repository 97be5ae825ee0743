# The two commands of the README: `make demo` and `make test`. Both install what they need.
PY := .venv/bin/python

.PHONY: demo test check unit lint setup

demo:
	scripts/setup.sh
	$(PY) -m driver launch -i inventories/local.ini --code-src examples --nproc-per-node 2 -- allreduce.py

test:
	scripts/setup.sh --cluster-tools
	scripts/test.sh

# The quick loop: lint, unit tests and one real cluster launch.
check:
	scripts/setup.sh --cluster
	scripts/test.sh quick
