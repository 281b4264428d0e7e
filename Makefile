# `make demo`: set up everything on a fresh machine and materialize the whole lineage on the real corpora.
# `make test`: set up (or reuse) the virtualenv and run the test suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= .largetrain
TORCH_VERSION ?= 2.13.0
export LARGETRAIN_ROOT := $(abspath $(DATA))
export DAGSTER_HOME := $(abspath $(DATA))/dagster_home

.PHONY: install corpora demo test dev clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install_torch.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	scripts/install_torch.sh $(PY) $(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Always run: the script fetches a corpus only when its directory or its provenance file is missing.
corpora: install
	PYTHON="$(PY)" scripts/fetch_corpora.sh $(DATA)/corpora

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

# The demo through the dagster CLI: one run per data partition for the per-document steps
# (raw_corpus + cleaned_text of both corpora), then one run for everything after them.
DAGSTER_CLI = $(VENV)/bin/dagster asset materialize -m largetrain_dagster.definitions -c configs/demo.yaml
PREP = pretrain/raw_corpus,pretrain/cleaned_text,domain/raw_corpus,domain/cleaned_text
REST = not group:landed_data and not key:"*/raw_corpus" and not key:"*/cleaned_text"

demo: install corpora $(DAGSTER_HOME)/dagster.yaml
	@start=$$(date +%s); : > $(DATA)/demo.log; \
	fail() { tail -n 60 $(DATA)/demo.log; echo "demo failed; full log: $(DATA)/demo.log"; exit 1; }; \
	for p in $$($(PY) -c 'from largetrain_dagster.partitions import DATA_PARTITIONS as d; print(*d.get_partition_keys())'); do \
	  echo "data partition $$p: raw_corpus, cleaned_text"; \
	  $(DAGSTER_CLI) --select '$(PREP)' --partition $$p >> $(DATA)/demo.log 2>&1 || fail; \
	done; \
	echo "deduplicated_text (all partitions) -> token_shards -> tokenizer -> base_checkpoint -> lora_adapter -> evaluation"; \
	$(DAGSTER_CLI) --select '$(REST)' >> $(DATA)/demo.log 2>&1 || fail; \
	$(PY) -m largetrain_dagster.summary --seconds $$(( $$(date +%s) - start )) --log $(DATA)/demo.log

test: install corpora
	scripts/install_system_deps.sh
	$(PY) -m pytest -q

# The web UI on http://127.0.0.1:3000 (loopback only).
dev: install corpora $(DAGSTER_HOME)/dagster.yaml
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf $(DATA)
