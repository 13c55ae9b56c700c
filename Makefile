# Two commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: install native demo test test-all bench lint clean

$(STAMP): pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP) native

native: $(STAMP)
	$(VPY) -c "from disc_tf.runtime import native_build; native_build.main()"

demo: install
	$(VPY) -m disc_tf.demo

test: install
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q

test-all: install
	$(VPY) -m pytest -q -m ''

bench: install
	$(VPY) -m bench.run

lint: $(STAMP)
	$(VPY) -m ruff check .

clean:
	rm -rf $(VENV) disc_tf/_native build *.egg-info
