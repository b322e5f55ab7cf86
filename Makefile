# Set-up and everyday commands. `make test` and `make demo` work on a fresh
# machine: they install what they need first.

SHELL := /bin/bash
CARGO ?= cargo
# One target directory outside the clone, reused across clones and CI runs.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/rustrec-target
BIN := $(CARGO_TARGET_DIR)/debug

# System packages: OpenMPI for distributed training, clang/libclang for the
# MPI bindings, pkg-config to find them; the Vulkan loader and Mesa's
# software Vulkan driver (lavapipe), the GPU executor's device in tests;
# OpenBLAS (its thread-safe pthread build), loaded at run time for the CPU
# executor's matrix products.
APT_PACKAGES := openmpi-bin libopenmpi-dev clang libclang-dev pkg-config libvulkan1 mesa-vulkan-drivers libopenblas0-pthread
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build test demo odl-demo ml100k bench bench-gpu parity parity-steps fuzz lint fmt clean

deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "system packages present"; fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install the Rust toolchain (rustup)"; exit 1; }
	@# Java and Maven run the Kafka broker of the tests and the demo.
	@command -v java >/dev/null && command -v mvn >/dev/null || { \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven; }

build: deps
	$(CARGO) build --locked --bins

# The tests' Kafka broker (tests/kafka.rs and others): started before the
# tests, stopped after them whatever their outcome.
KAFKA_RUN := $(CURDIR)/.kafka-run

# The serving tests' official clients, each in its own virtual environment
# (their protobuf versions disagree): tritonclient (HTTP and gRPC), and
# grpcio with TF Serving's protos (tensorflow-serving-api, whose messages
# import TensorFlow's own; the TensorFlow it was released with).
CLIENTS_VENV := .venv-triton
TFSERVING_VENV := .venv-tfserving
$(CLIENTS_VENV)/installed:
	python3 -m venv $(CLIENTS_VENV) || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv && python3 -m venv $(CLIENTS_VENV); }
	$(CLIENTS_VENV)/bin/pip install --quiet "tritonclient[http,grpc]==2.73.0" "numpy<3"
	$(CLIENTS_VENV)/bin/python -c "import tritonclient.grpc, tritonclient.http" && touch $@
$(TFSERVING_VENV)/installed:
	python3 -m venv $(TFSERVING_VENV) || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv && python3 -m venv $(TFSERVING_VENV); }
	$(TFSERVING_VENV)/bin/pip install --quiet "tensorflow-cpu==2.12.1"
	$(TFSERVING_VENV)/bin/pip install --quiet --no-deps "tensorflow-serving-api==2.12.1"
	PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python $(TFSERVING_VENV)/bin/python -c "from tensorflow_serving.apis import prediction_service_pb2_grpc" && touch $@

# The storage tests' S3-compatible server and HDFS (tests/storage.rs),
# likewise; their addresses reach the tests through RUN/env.
STORAGE_RUN := $(CURDIR)/.storage-run

test: deps $(CLIENTS_VENV)/installed $(TFSERVING_VENV)/installed
	scripts/kafka-broker start $(KAFKA_RUN)
	scripts/storage-servers start $(STORAGE_RUN) || { scripts/kafka-broker stop $(KAFKA_RUN); exit 1; }
	trap 'scripts/kafka-broker stop $(KAFKA_RUN); scripts/storage-servers stop $(STORAGE_RUN)' EXIT; \
	  set -a; . $(STORAGE_RUN)/env; set +a; \
	  RUSTREC_KAFKA=127.0.0.1:$$(cat $(KAFKA_RUN)/port) \
	  RUSTREC_TRITON_PYTHON=$(CURDIR)/$(CLIENTS_VENV)/bin/python RUSTREC_TFSERVING_PYTHON=$(CURDIR)/$(TFSERVING_VENV)/bin/python \
	  $(CARGO) test --locked --features gpu

# Criteo-shaped synthetic data with a planted model (gen_data prints its AUC).
data/synthetic/train.parquet: | build
	$(BIN)/gen_data --output data/synthetic/train.parquet --rows 512000 --cap 100000 --seed 1
	$(BIN)/gen_data --output data/synthetic/eval.parquet --rows 50000 --cap 100000 --seed 2

# MovieLens-100k as a CTR task (rating >= 4 is a click), from the shared data.
ML100K_SRC ?= ../shared/data/real/ml-100k
data/ml100k/train.csv: | build
	$(BIN)/prep_movielens --input $(ML100K_SRC) --output data/ml100k

ml100k: build data/ml100k/train.csv
	rm -rf experiments/wide_and_deep_ml100k experiments/dlrm_ml100k experiments/dbmtl_ml100k experiments/mmoe_ml100k experiments/din_ml100k experiments/dssm_ml100k experiments/esmm_ml100k experiments/autoint_ml100k experiments/bst_ml100k experiments/din_backbone_ml100k experiments/cmbf_ml100k experiments/uniter_ml100k experiments/mind_ml100k
	$(BIN)/train_eval --pipeline_config_path samples/wide_and_deep_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/dlrm_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/dbmtl_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/mmoe_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/din_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/bst_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/din_backbone_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/dssm_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/esmm_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/autoint_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/cmbf_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/uniter_ml100k.config
	$(BIN)/train_eval --pipeline_config_path samples/mind_ml100k.config

demo: build data/synthetic/train.parquet
	@echo "== DLRM on the bundled 200-row Criteo sample (CSV)"
	rm -rf experiments/dlrm_criteo_sample
	$(BIN)/train_eval --pipeline_config_path samples/dlrm_criteo_sample.config
	@echo "== DLRM on generated Criteo-shaped Parquet, one epoch (compare with the planted AUC above)"
	rm -rf experiments/dlrm_synthetic
	$(BIN)/train_eval --pipeline_config_path samples/dlrm_synthetic.config

# Online learning as EasyRec's ODL recipe runs it: MovieLens-100k through a
# local Kafka broker, a job training from the stream with incremental
# updates, `serve` applying them live; prints how fresh the served model is.
odl-demo: build
	rm -rf experiments/odl_ml100k
	$(BIN)/prep_movielens --input $(ML100K_SRC) --output experiments/odl_ml100k/data --by_time --eval_fraction 0.1
	scripts/kafka-broker start $(KAFKA_RUN)-demo
	trap 'scripts/kafka-broker stop $(KAFKA_RUN)-demo' EXIT; \
	  python3 scripts/odl_demo.py $(BIN) experiments/odl_ml100k/data 127.0.0.1:$$(cat $(KAFKA_RUN)-demo/port) experiments/odl_ml100k

# The PyTorch (CPU) baseline of `make bench`, in a local virtual environment.
VENV := .venv
# A stamp written only after torch installed, so a failed install is retried.
$(VENV)/torch-installed:
	@command -v python3 >/dev/null || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3 python3-venv; }
	python3 -m venv $(VENV) || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv && python3 -m venv $(VENV); }
	$(VENV)/bin/pip install --quiet torch
	$(VENV)/bin/python -c "import torch" && touch $@

# onnxruntime for the serving baseline of `make bench`.
$(VENV)/ort-installed: $(VENV)/torch-installed
	$(VENV)/bin/pip install --quiet onnxruntime==1.32.0 numpy
	$(VENV)/bin/python -c "import onnxruntime" && touch $@

# Training throughput (optimised build, 2 threads): DLRM and WideAndDeep on
# the Criteo Kaggle shape with tables capped at 1M rows, each step's
# per-phase account against the machine's GEMM peak, the PyTorch
# baseline beside them (with the CPU's ISA), a scaling table, then sharded
# on 2 ranks. Then serving: the
# DLRM sample's export behind `serve` against onnxruntime behind a Python
# server (loopback, 100-row requests at 1, 8 and 64 clients), and the
# exported graph's time per row at batch 64 and 2048. Last, a straggler
# (one worker sleeping after each step) under synchronous and asynchronous
# training on 4 ranks.
SERVE_BENCH := experiments/serve_bench
bench: deps $(VENV)/torch-installed $(VENV)/ort-installed
	$(CARGO) build --locked --release --bin bench
	$(CARGO_TARGET_DIR)/release/bench --threads 2
	@echo "== where each model's step goes, against the machine's GEMM peak"
	$(CARGO_TARGET_DIR)/release/bench --threads 2 --profile
	$(VENV)/bin/python bench/compare.py --bench $(CARGO_TARGET_DIR)/release/bench --python $(VENV)/bin/python
	@echo "== the same global batch on 2 MPI ranks with 1 thread each (tables sharded)"
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	  mpirun --oversubscribe --bind-to none -np 2 $(CARGO_TARGET_DIR)/release/bench --threads 1 --distributed
	@echo "== key-value tables (ev_params) against arrays, and a key-value table grown to 10M keys"
	$(CARGO_TARGET_DIR)/release/bench --threads 2 --key_value --models DLRM,WideAndDeep
	$(CARGO) build --locked --release --bin train_eval --bin export --bin serve --bin serve_bench
	rm -rf $(SERVE_BENCH)
	$(CARGO_TARGET_DIR)/release/train_eval --pipeline_config_path samples/dlrm_criteo_sample.config --model_dir $(SERVE_BENCH)/model
	$(CARGO_TARGET_DIR)/release/export --pipeline_config_path samples/dlrm_criteo_sample.config --model_dir $(SERVE_BENCH)/model --export_dir $(SERVE_BENCH)/export
	$(CARGO_TARGET_DIR)/release/serve_bench --export $(SERVE_BENCH)/export --data data/criteo_sample.csv \
	  --serve $(CARGO_TARGET_DIR)/release/serve --python $(VENV)/bin/python
	python3 bench/straggler.py --bin $(CARGO_TARGET_DIR)/release/train_eval
	@echo "== Parquet read from a local S3-compatible server against the same file on local disk"
	scripts/storage-servers start $(STORAGE_RUN)-bench
	trap 'scripts/storage-servers stop $(STORAGE_RUN)-bench' EXIT; set -a; . $(STORAGE_RUN)-bench/env; set +a; \
	  AWS_ENDPOINT_URL=$$RUSTREC_S3_ENDPOINT AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 \
	  $(CARGO_TARGET_DIR)/release/bench --threads 2 --models DLRM,WideAndDeep --remote s3://rustrec-test/bench
	@echo "== incremental updates: their cost to training, and how fresh serve's answers are"
	$(CARGO_TARGET_DIR)/release/bench --threads 2 --incremental --models DLRM,WideAndDeep --steps 100
	$(CARGO) build --locked --release --bin kafka_produce --bin prep_movielens
	$(CARGO_TARGET_DIR)/release/prep_movielens --input $(ML100K_SRC) --output $(SERVE_BENCH)/ml100k_by_time --by_time --eval_fraction 0.1
	scripts/kafka-broker start $(KAFKA_RUN)-bench
	trap 'scripts/kafka-broker stop $(KAFKA_RUN)-bench' EXIT; \
	  for poll in 0.1 1; do rm -rf $(SERVE_BENCH)/odl; \
	    python3 scripts/odl_demo.py $(CARGO_TARGET_DIR)/release $(SERVE_BENCH)/ml100k_by_time 127.0.0.1:$$(cat $(KAFKA_RUN)-bench/port) \
	      $(SERVE_BENCH)/odl $$poll 2>/dev/null | grep '^== .*freshness'; done

# The GPU executor on a machine with a GPU and a CUDA build of torch in
# GPU_PYTHON: 20 steps of each model checked against the CPU executor, both
# executors timed, then PyTorch on the same GPU (scripts/gpu-bench).
GPU_PYTHON ?= python3
bench-gpu: deps
	$(CARGO) build --locked --release --features gpu --bin bench
	scripts/gpu-bench $(CARGO_TARGET_DIR)/release/bench $(GPU_PYTHON)

# EasyRec itself (pai-easy-rec 0.7.1 on TensorFlow 2.12, about 600 MB) for
# `make parity`, in its own virtual environment; it needs Python 3.11 or
# older. sitecustomize.py adds the shims 0.7.1 needs on Python 3.11 and
# numpy 1.24 (collections.Iterator, np.object, ...).
EASYREC_VENV := .venv-easyrec
EASYREC_PYTHON ?= $(shell command -v python3.11 || command -v python3)
$(EASYREC_VENV)/easyrec-installed:
	$(EASYREC_PYTHON) -m venv $(EASYREC_VENV) || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv && $(EASYREC_PYTHON) -m venv $(EASYREC_VENV); }
	$(EASYREC_VENV)/bin/pip install --quiet "tensorflow-cpu==2.12.1"
	$(EASYREC_VENV)/bin/pip install --quiet pai-easy-rec==0.7.1
	$(EASYREC_VENV)/bin/pip install --quiet numpy==1.24.3 pandas==2.0.3 "matplotlib<3.9" "contourpy<1.3" pyarrow==16.1.0
	cp bench/parity/sitecustomize.py $$($(EASYREC_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/
	$(EASYREC_VENV)/bin/python -c "import easy_rec" && touch $@

# Quality beside EasyRec: the four MovieLens-100k configs of bench/parity
# trained by both (EasyRec three times), all scored with exact metrics.
parity: build data/ml100k/train.csv $(EASYREC_VENV)/easyrec-installed
	python3 bench/parity.py --bin $(BIN) --python $(EASYREC_VENV)/bin/python

# Training steps beside EasyRec: each parity model trained three steps by
# EasyRec and by us from EasyRec's initial checkpoint, in file order without
# dropout, every variable compared after each step.
parity-steps: build data/ml100k/train.csv $(EASYREC_VENV)/easyrec-installed
	$(EASYREC_VENV)/bin/python bench/parity_step.py --bin $(BIN)

# Coverage-guided fuzzing (cargo fuzz, libFuzzer) of every reader of files
# and requests written elsewhere: each target runs FUZZ_SECONDS from the seed
# corpus; a crash, a hang (-timeout) or memory past -rss_limit_mb stops it
# with the input saved under fuzz/artifacts/. Logs go to fuzz/logs/.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= tf_checkpoint tfrecord safetensors config csv parquet serve_request
FUZZ_FLAGS := -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1
fuzz: build
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked --version 0.13.2
	$(CARGO) run --locked --example fuzz_seeds -- fuzz/corpus
	rm -rf fuzz/model && $(BIN)/train_eval --pipeline_config_path fuzz/serve_model.config
	$(BIN)/export --pipeline_config_path fuzz/serve_model.config --export_dir fuzz/model/export
	mkdir -p fuzz/logs
	cd fuzz && export CARGO_TARGET_DIR=$(CURDIR)/fuzz/target \
	  RUSTREC_FUZZ_EXPORT=$$(ls -d $(CURDIR)/fuzz/model/export/*/ | tail -1) && \
	for t in $(FUZZ_TARGETS); do \
	  echo "fuzzing $$t for $(FUZZ_SECONDS) s"; \
	  cargo fuzz run --sanitizer none -O $$t corpus/$$t -- $(FUZZ_FLAGS) > logs/$$t.log 2>&1 \
	    || { tail -40 logs/$$t.log; exit 1; }; \
	  grep -E "stat::number_of_executed_units|^#[0-9]+.*DONE" logs/$$t.log | tail -2; \
	done

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	$(CARGO) clippy --locked --all-targets --features gpu -- -D warnings

fmt:
	$(CARGO) fmt

clean:
	rm -rf experiments data/synthetic data/ml100k
