# Every target bootstraps .venv on a fresh machine; nothing needs installing by hand.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is pinned for the test setup only (a CPU build); the library itself leaves it open.
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed
# litdata writes the LitData test datasets. Its torchvision requirement serves images, and the
# registry's torchvision does not load with the CPU torch, so it is installed without it.
LITDATA := litdata==0.2.76 lightning-utilities==0.15.3 zstd==1.5.7.2
# PyTorch Lightning for the zephon_lightning tests, pinned and without the resolver: with it
# among the extras, pip spent minutes backtracking over the whole set. Its other
# requirements (fsspec, PyYAML, packaging, tqdm) come with the packages above.
LIGHTNING := lightning==2.6.6 pytorch-lightning==2.6.6 torchmetrics==1.9.0
# The Megatron tests and smoke run again under Python 3.12 with the newest megatron-core
# (0.17+ needs 3.12; there torch 2.13.0 is a CUDA build from the registry, about 5 GB).
# The first candidate that really runs Python 3.12: a pyenv shim answers `command -v` even when
# 3.12 is not among the active versions, so each candidate is asked for its version.
ifeq ($(origin PYTHON312),undefined)
PYTHON312 := $(shell for p in "$$(command -v python3.12 2>/dev/null)" \
  $$(ls -d $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12 2>/dev/null); do \
  [ -n "$$p" ] && "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
  >/dev/null 2>&1 && { echo "$$p"; break; }; done)
endif
VENV312 := .venv-py312
PY312 := $(VENV312)/bin/python
MEGATRON_CORE_312 := megatron-core==0.19.2
STAMP312 := $(VENV312)/.installed

.PHONY: demo test test-py311 test-quick install-py312 lint bench smoke-torchtitan smoke-megatron \
  test-megatron-py312 clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Azurite (Azure Blob's emulator, a Node package) for the object-store tests.
AZURITE := .azurite/node_modules/.bin/azurite-blob
AZURITE_VERSION := 3.35.0

$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e ".[hf,s3,gs,az,dev,torch,torchtitan,megatron,viz,fast]" $(TORCH_PIN)
	$(PIP) install -q --no-deps $(LITDATA) $(LIGHTNING)
	touch $(STAMP)

$(AZURITE):
	@command -v npm >/dev/null || { echo "npm is needed to install Azurite for the tests"; exit 1; }
	npm install --prefix .azurite azurite@$(AZURITE_VERSION) --no-audit --no-fund --silent

install: $(STAMP) $(AZURITE)

# megatron-training adds six and triton, which megatron.training imports (pretrain() tests).
$(STAMP312): pyproject.toml
	$(PYTHON312) -m venv $(VENV312)
	$(PY312) -m pip install -q --upgrade pip
	$(PY312) -m pip install -q -e ".[hf,s3,dev,megatron-training,fast]" $(TORCH_PIN) $(MEGATRON_CORE_312) tensorboard
	touch $(STAMP312)

# The loader tour (core), then TorchTitan's debug model trained for 10 steps with it (adapter).
demo: $(STAMP)
	$(PY) -m zephon.demo
	$(PY) -m zephon_torchtitan_tools.demo --steps 10

# The suite runs on TEST_WORKERS pytest-xdist processes, each taking whole test modules (so a
# module's fixtures, such as a trained run shared by its tests, are made once). The Python 3.12
# environment installs (mostly a download) while the Python 3.11 suite runs. The smoke runs
# (make smoke-megatron, smoke-torchtitan) are what tests/megatron and tests/torchtitan train.
TEST_WORKERS ?= 2
PYTEST_ARGS := -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: $(STAMP) $(AZURITE)
	$(PY) -m ruff check .
	$(MAKE) --no-print-directory -j2 test-py311 install-py312
	$(MAKE) --no-print-directory test-megatron-py312

# Where Python 3.12 runs the Megatron tests, the Megatron trainings of
# test_megatron_multiprocess.py run there only (with the newest megatron-core); the other
# Megatron tests run under both, so megatron-core 0.16 keeps its provider, batch and model
# tests.
PY311_SKIP := $(if $(strip $(PYTHON312)),--ignore=tests/megatron/test_megatron_multiprocess.py)

test-py311: $(STAMP) $(AZURITE)
	$(PY) -m pytest $(PYTEST_ARGS) $(PY311_SKIP) tests

# The inner loop: the core, IO and torch-adapter tests that start no trainer and no process
# group (about 3 minutes on 2 cores).
test-quick: $(STAMP) $(AZURITE)
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow and not multiprocess" tests/core tests/hub \
	  tests/objectstore tests/torch tests/test_import_rules.py tests/test_repository_map.py

install-py312:
ifneq ($(strip $(PYTHON312)),)
	$(MAKE) --no-print-directory $(STAMP312)
endif

# The Megatron tests under Python 3.12 and megatron-core 0.19 (skipped, saying so, where no
# python3.12 exists).
test-megatron-py312:
ifeq ($(strip $(PYTHON312)),)
	@echo "test-megatron-py312: SKIPPED: no python3.12 on this machine (megatron-core 0.17+ needs it)"
else
	$(MAKE) --no-print-directory $(STAMP312)
	$(PY312) -m pytest $(PYTEST_ARGS) tests/megatron
endif

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) -m benchmarks.throughput
	$(PY) -m benchmarks.pipeline_cost
	$(PY) -m benchmarks.startup
	$(PY) -m benchmarks.state_size

clean:
	rm -rf $(VENV) $(VENV312) .pytest_cache

# TorchTitan's llama3 debug model trained with Zephon on the bundled corpus, on 1 and on 2
# processes (gloo on CPU); fails unless the loss falls.
smoke-torchtitan: $(STAMP)
	$(PY) -m zephon_torchtitan_tools.demo --toml recipes/torchtitan/smoke.toml --nproc 1 --steps 10
	$(PY) -m zephon_torchtitan_tools.demo --toml recipes/torchtitan/smoke.toml --nproc 2 --steps 10

# megatron-core's GPTModel (local layer spec) and DistributedDataParallel trained on CPU through
# the Megatron adapter's provider, iterators and get_batch, on 1 and on 2 processes (gloo);
# fails unless the loss falls.
SMOKE_MEGATRON_DIR ?= $(or $(TMPDIR),/tmp)/zephon-smoke-megatron
# The third run switches loaders the Megatron way: --data-path blends indexed datasets.
SMOKE_PY ?= $(PY)
smoke-megatron: $(if $(filter $(PY),$(SMOKE_PY)),$(STAMP))
	rm -rf $(SMOKE_MEGATRON_DIR)
	$(SMOKE_PY) -m zephon_megatron_tools.smoke --nproc 1 --workdir $(SMOKE_MEGATRON_DIR)/1 --check-loss
	$(SMOKE_PY) -m zephon_megatron_tools.smoke --nproc 2 --workdir $(SMOKE_MEGATRON_DIR)/2 --check-loss
	$(SMOKE_PY) -m zephon_megatron_tools.smoke --write-indexed-demo $(SMOKE_MEGATRON_DIR)/data
	$(SMOKE_PY) -m zephon_megatron_tools.smoke --nproc 2 --workdir $(SMOKE_MEGATRON_DIR)/3 --check-loss -- \
	  --data-path 0.7 $(SMOKE_MEGATRON_DIR)/data/web_text_document \
	  0.3 $(SMOKE_MEGATRON_DIR)/data/code_text_document --split 98,2,0 \
	  --dataloader zephon --zephon-lanes 8 --vocab-size 4096 \
	  --seq-length 64 --micro-batch-size 2 --global-batch-size 8 \
	  --reset-position-ids --reset-attention-mask --calculate-per-token-loss \
	  --transformer-impl local --train-iters 12 --eval-iters 0 --eval-interval 12
