# Every target bootstraps .venv on a fresh machine; nothing needs installing by hand.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is pinned for the test setup only (a CPU build); the library itself leaves it open.
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench smoke-torchtitan smoke-megatron clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e ".[hf,dev,torchtitan,megatron,viz]" $(TORCH_PIN)
	touch $(STAMP)

install: $(STAMP)

# The loader tour (core), then TorchTitan's debug model trained for 10 steps with it (adapter).
demo: $(STAMP)
	$(PY) -m zephon.demo
	$(PY) -m zephon_torchtitan.demo --steps 10

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) -m benchmarks.throughput
	$(PY) -m benchmarks.state_size

clean:
	rm -rf $(VENV) .pytest_cache

# TorchTitan's llama3 debug model trained with Zephon on the bundled corpus, on 1 and on 2
# processes (gloo on CPU); fails unless the loss falls.
smoke-torchtitan: $(STAMP)
	$(PY) -m zephon_torchtitan.demo --toml recipes/torchtitan/smoke.toml --nproc 1 --steps 10
	$(PY) -m zephon_torchtitan.demo --toml recipes/torchtitan/smoke.toml --nproc 2 --steps 10

# megatron-core's GPTModel (local layer spec) and DistributedDataParallel trained on CPU through
# the Megatron adapter's provider, iterators and get_batch, on 1 and on 2 processes (gloo);
# fails unless the loss falls.
SMOKE_MEGATRON_DIR ?= $(or $(TMPDIR),/tmp)/zephon-smoke-megatron
# The third run switches loaders the Megatron way: --data-path blends indexed datasets.
smoke-megatron: $(STAMP)
	rm -rf $(SMOKE_MEGATRON_DIR)
	$(PY) -m zephon_megatron.smoke --nproc 1 --workdir $(SMOKE_MEGATRON_DIR)/1 --check-loss
	$(PY) -m zephon_megatron.smoke --nproc 2 --workdir $(SMOKE_MEGATRON_DIR)/2 --check-loss
	$(PY) -m zephon_megatron.smoke --write-indexed-demo $(SMOKE_MEGATRON_DIR)/data
	$(PY) -m zephon_megatron.smoke --nproc 2 --workdir $(SMOKE_MEGATRON_DIR)/3 --check-loss -- \
	  --data-path 0.7 $(SMOKE_MEGATRON_DIR)/data/web_text_document \
	  0.3 $(SMOKE_MEGATRON_DIR)/data/code_text_document --split 98,2,0 \
	  --dataloader zephon --zephon-lanes 8 --vocab-size 4096 \
	  --seq-length 64 --micro-batch-size 2 --global-batch-size 8 \
	  --reset-position-ids --reset-attention-mask --calculate-per-token-loss \
	  --transformer-impl local --train-iters 12 --eval-iters 0
