# ortagent: every target sets itself up (virtual environments, packages) on a fresh machine.
#   make test    build the extension and run the test suite (what .ci/run calls)
#   make demo    train a small classifier end to end with TrainingAgent
#   make demo-torch  train a small char-level GPT through ortagent.torch.ORTModule next to eager
#   make bench   run the benchmarks side by side with onnxruntime and the C floor (results in
#                build/bench: latest.json, latest.md, latest.png)
#   make test-ft / bench-ft  the suite / the threads benchmark on a free-threaded CPython with
#                the GIL off (skipped when none is found; FT_PYTHON names one)
#   make test-torch-ops  the whole differential sweep of ORTModule over torch's op_db and
#                module_db (tests/torch_sweep.py; make test runs a fixed sample of it)
# Variables: PYTHON (interpreter for the venvs), ORT_PACKAGE (the onnxruntime wheel to test
# against), TORCH=1 (also install torch and the packages of the torch tests), PYTEST_ARGS,
# BUILD_JOBS (modules translated and compiled at a time; default: the CPUs, see setup.py).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ORT_PACKAGE ?= onnxruntime-gpu==1.31.1
TORCH ?= 0
# torch with the packages the torch tests use, pinned: torchvision (its wheels build against one
# torch release), the dynamo exporter's onnxscript, torch's test databases' expecttest, and the
# model families of tests/test_torch_models.py (built from configs: nothing is downloaded), and
# what transformers' Trainer needs in tests/test_torch_trainer.py (accelerate, datasets)
TORCH_PACKAGES ?= torch==2.14.1 torchvision==0.29.1 onnxscript==0.7.2 expecttest==0.3.0 transformers==5.18.0 \
	timm==1.0.31 accelerate==1.16.0 datasets==5.2.0
TORCH_READY = $(VENV)/.torch-$(shell echo '$(TORCH_PACKAGES)' | cksum | cut -d' ' -f1)
REF_VENV ?= .venv-refagent
REF_PACKAGES ?= onnxruntime-training-cpu==1.19.2 numpy<2
PYTEST_ARGS ?=
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
export ORTAGENT_BUILD_JOBS := $(BUILD_JOBS)

.PHONY: all test build venv refagent demo demo-torch bench bench-quick ft-build test-ft bench-ft fuzz asan dist-check clean \
	test-torch-ops

all: test

$(VENV)/.ready: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check "setuptools>=77" "Cython>=3.1" "numpy>=2.0"
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation -e ".[test]" "$(ORT_PACKAGE)"
	touch $@

venv: $(VENV)/.ready
	@if [ "$(TORCH)" = "1" ] && [ ! -f $(TORCH_READY) ]; then \
		echo "installing $(TORCH_PACKAGES) for the torch tests"; \
		$(PY) -m pip install -q --disable-pip-version-check $(TORCH_PACKAGES) && touch $(TORCH_READY); fi

build: venv
	$(PY) setup.py -q build_ext --inplace

# onnxruntime-training 1.19.2 (the last release with the real TrainingAgent) in its own venv:
# the agreement tests compare ortagent's agent with it. If it cannot be installed here, those
# tests skip and say why.
$(REF_VENV)/.ready:
	@($(PYTHON) -m venv $(REF_VENV) && \
	  $(REF_VENV)/bin/python -m pip install -q --disable-pip-version-check $(foreach p,$(REF_PACKAGES),"$(p)") && \
	  touch $@) || echo "note: could not install $(REF_PACKAGES); agreement tests will skip"

refagent: $(REF_VENV)/.ready

test: build refagent
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

# The whole differential sweep of ortagent.torch.ORTModule over torch's OpInfo database (op_db)
# and module database (module_db): SWEEP_ARGS passes options (e.g. SWEEP_ARGS="--samples 1").
# Results (every case and the table) in build/torch_sweep/outcomes.json; fails when a case
# differs from eager without an ortagent error.
SWEEP_ARGS ?=

test-torch-ops: TORCH := 1
test-torch-ops: build
	$(PY) tests/torch_sweep.py $(SWEEP_ARGS)

# Long fuzzing: tests/test_fuzz.py with the ortagent-fuzz hypothesis profile, drawing batches of
# examples until FUZZ_SECONDS have passed (each of its two fuzz tests gets that budget).
FUZZ_SECONDS ?= 600

fuzz: build
	HYPOTHESIS_PROFILE=ortagent-fuzz FUZZ_SECONDS=$(FUZZ_SECONDS) $(PY) -m pytest -q -s -ra tests/test_fuzz.py $(PYTEST_ARGS)

# AddressSanitizer: the extension built with -fsanitize=address in a copy of the tree (ASAN_DIR;
# the in-place build is left alone), ASAN_TESTS run there with gcc's libasan preloaded -- and
# libstdc++, so that ASan can intercept the C++ exceptions onnxruntime throws -- and Python's
# allocator switched to malloc so that ASan sees Python objects too; then a LeakSanitizer check of
# ortagent workloads (tests/lsan_check.py). Leak detection stays off for the suite: a Python
# process ends with memory LeakSanitizer cannot tell from leaks. test_typing (static checks) is
# left out.
ASAN_DIR ?= build/asan
ASAN_TESTS ?= tests
ASAN_PRELOAD = $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libstdc++.so)
ASAN_RUN_OPTIONS ?= detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:print_summary=1

asan: venv refagent
	rm -rf $(ASAN_DIR) && mkdir -p $(ASAN_DIR) .cache
	git ls-files --cached --others --exclude-standard -z | xargs -0 tar cf - | tar xf - -C $(ASAN_DIR)
	ln -sfn $(CURDIR)/.cache $(ASAN_DIR)/.cache
	ln -sfn $(CURDIR)/$(REF_VENV) $(ASAN_DIR)/$(REF_VENV)
	cd $(ASAN_DIR) && ORTAGENT_CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g" \
		ORTAGENT_LDFLAGS="-fsanitize=address" $(abspath $(PY)) setup.py -q build_ext --inplace
	cd $(ASAN_DIR) && LD_PRELOAD="$(ASAN_PRELOAD)" ASAN_OPTIONS=$(ASAN_RUN_OPTIONS) PYTHONMALLOC=malloc \
		$(abspath $(PY)) -m pytest -q -ra -p no:cacheprovider $(ASAN_TESTS) --ignore=tests/test_typing.py $(PYTEST_ARGS)
	cd $(ASAN_DIR) && PYTHONPATH=$(abspath $(ASAN_DIR)) $(abspath $(PY)) tests/lsan_check.py

# python -m benchmarks.bench (the benchmarks package, from the repository root); results go to
# build/bench (latest.json, latest.md, latest.png). BENCH_ARGS passes options (e.g.
# BENCH_ARGS="--groups calls,values").
bench bench-quick: build refagent
	@$(PY) -c "import tqdm, matplotlib" 2>/dev/null || \
		$(PY) -m pip install -q --disable-pip-version-check tqdm matplotlib
	$(PY) -m benchmarks.bench $(if $(filter bench-quick,$@),--quick) $(BENCH_ARGS)

# Free-threaded CPython (3.13t+) with the GIL off: ortagent built in a copy of the tree (FT_DIR;
# the in-place build is left alone) for FT_PYTHON, in a venv of its own (FT_VENV: numpy, onnx and
# onnxruntime's cp313t wheels, pytest, hypothesis; wheels only, pinned in FT_PACKAGES to releases
# that ship cp313t wheels: newer onnx and hypothesis build from source there, which needs CMake
# downloads and a Rust toolchain). test-ft runs the suite there with
# PYTHON_GIL=0, bench-ft the threads group (results in FT_DIR/build/bench). Without a free-threaded
# interpreter (none on PATH, none at /opt/py313t) both say so and succeed.
FT_PYTHON ?= $(firstword $(shell command -v python3.14t python3.13t 2>/dev/null) $(wildcard /opt/py313t/bin/python3.13t))
FT_DIR ?= build/ft
FT_VENV ?= build/venv-ft
FT_PACKAGES ?= numpy==2.4.6 onnx==1.21.0 onnxruntime==1.32.0 hypothesis==6.155.7 onnx-ad==0.3.0
FT_BENCH_ARGS ?=
FT_READY = $(FT_DIR)/.built

ft-build:
	@rm -f $(FT_READY)
	@if [ -z "$(FT_PYTHON)" ] || ! "$(FT_PYTHON)" -c "import sys, sysconfig; sys.exit(not sysconfig.get_config_var('Py_GIL_DISABLED'))" 2>/dev/null; then \
		echo "no free-threaded CPython found (FT_PYTHON='$(FT_PYTHON)'): free-threaded build skipped"; exit 0; fi; \
	set -e; \
	if [ ! -x $(FT_VENV)/bin/python ]; then \
		"$(FT_PYTHON)" -m venv $(FT_VENV); \
		$(FT_VENV)/bin/python -m pip install -q --disable-pip-version-check --only-binary=:all: "setuptools>=77" \
			"Cython>=3.1" $(FT_PACKAGES) pytest tqdm; fi; \
	rm -rf $(FT_DIR) && mkdir -p $(FT_DIR) .cache; \
	git ls-files --cached --others --exclude-standard -z | xargs -0 tar cf - | tar xf - -C $(FT_DIR); \
	ln -sfn $(CURDIR)/.cache $(FT_DIR)/.cache; \
	cd $(FT_DIR) && $(abspath $(FT_VENV))/bin/python setup.py -q build_ext --inplace && touch .built

test-ft: ft-build
	@if [ -f $(FT_READY) ]; then cd $(FT_DIR) && PYTHON_GIL=0 $(abspath $(FT_VENV))/bin/python -m pytest -q -ra \
		-p no:cacheprovider tests $(PYTEST_ARGS); fi

bench-ft: ft-build
	@if [ -f $(FT_READY) ]; then cd $(FT_DIR) && PYTHON_GIL=0 $(abspath $(FT_VENV))/bin/python -m benchmarks.bench \
		--groups threads --no-plot $(FT_BENCH_ARGS); fi

# The demo's own packages (scikit-learn ships the digits data: nothing is downloaded at run time).
# DEMO_ARGS passes options to demo/train_digits.py, e.g. DEMO_ARGS="--device cuda --epochs 40".
DEMO_PACKAGES ?= scikit-learn matplotlib tqdm
DEMO_ARGS ?=

demo: build
	@$(PY) -c "import sklearn, matplotlib, tqdm" 2>/dev/null || { \
		echo "installing the demo's packages: $(DEMO_PACKAGES)"; \
		$(PY) -m pip install -q --disable-pip-version-check $(DEMO_PACKAGES); }
	$(PY) demo/train_digits.py --out build/demo/digits_loss.png $(DEMO_ARGS)

# A char-level GPT trained through ortagent.torch.ORTModule next to torch eager, on the source of
# a standard-library module (nothing downloaded). Installs torch (CPU build) and onnxscript like
# TORCH=1, and tqdm + matplotlib. DEMO_TORCH_ARGS passes options, e.g. DEMO_TORCH_ARGS="--steps 600".
DEMO_TORCH_ARGS ?=

demo-torch: TORCH := 1
demo-torch: build
	@$(PY) -c "import matplotlib, tqdm" 2>/dev/null || { \
		echo "installing the demo's packages: matplotlib tqdm"; \
		$(PY) -m pip install -q --disable-pip-version-check matplotlib tqdm; }
	$(PY) demo/train_char_gpt.py --out build/demo/char_gpt_loss.png $(DEMO_TORCH_ARGS)

# Build the sdist and wheel, check their contents, install the sdist into a fresh venv and run it.
dist-check: build
	$(PY) -m pip install -q --disable-pip-version-check build
	$(PY) tools/check_dist.py

clean:
	rm -rf build ortagent/*.so ortagent/_*.c ortagent/*.html .pytest_cache
