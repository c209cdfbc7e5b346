"""Benchmarks and load drivers: they measure attnserve and are not part of it (the wheel leaves
them out; nothing under attnserve/ imports them). Run from the checkout's root, in its venv:

    python -m benchmarks.decode     ONNX Runtime vs PyTorch decode speed (make bench)
    python -m benchmarks.serving    the engine in-process vs through gRPC, by concurrency (make bench)
    python -m benchmarks.kv         arena vs concat vs onnxruntime-genai on one directory (make kv-bench)
    python -m benchmarks.engine_cost  the engine's own cost against a plain loop (make perf)
    python -m benchmarks.host_cost  the engine's host work alone: tokens/s over a runner that computes nothing
    python -m benchmarks.engine_core  --engine-core process vs thread vs onnxruntime-genai through gRPC (make perf)
    python -m benchmarks.gpu_check  the CUDA path proven and measured on a CUDA host (make gpu-check)
    python -m benchmarks.import_sizes  Hugging Face checkpoints at 124M/135M: import, export, serve (make import-sizes)
    python -m benchmarks.size_ladder  1M to 135M parameters, float32/int8/int4, five runtimes side by side (make sizes)
    python -m benchmarks.served_ab  two `attnserve serve` settings through gRPC, alternating
    python -m benchmarks.bench_doors  `attnserve bench` on the gRPC door vs the HTTP door, one server
    python -m benchmarks.batch_invariance  a request's tokens alone, batched and from the prefix cache
    python -m benchmarks.pass_speed  the batched logits pass alone, two checkouts alternating
    python -m benchmarks.whole_draw_ab  the host's compiled draw of two checkouts, call by call
    python -m benchmarks.cross_width  an encoder-decoder's decode step by the width its source is bound with
    python -m benchmarks.cuda_graphs  decode steps as CUDA graphs vs launched node by node (CUDA)
    python -m benchmarks.step_profile  where a decode step's time goes, per kind of node, against the bandwidth
    python -m benchmarks.kernel_nbits  the quantized MatMul kernels alone at batch 1, by bits, block and accuracy
    python -m benchmarks.loadtest.soak      many misbehaving streams for a long time (make soak)
    python -m benchmarks.loadtest.overload  open-loop arrivals above capacity (make overload)
    python -m benchmarks.loadtest.refusals  the front end's CPU a refused call costs, two trees alternating
    python benchmarks/ray_bench.py          Ray Serve vs attnserve serve
    python benchmarks/tokenizer_table.py    bytes vs BPE, trained for the same budget (make tokenizer-table)
    python benchmarks/tokenizer_serving.py  the two tokenizers' models served side by side

hf_checkpoints.py makes Hugging Face checkpoint directories from configs (the tests' and import_sizes');
concat_runner.py and concat_cache.py are the engine the KV arena replaced, kept as kv's baseline;
genai_bench.py is onnxruntime-genai's side, run in .venv-genai; ladder_sides.py is each side of the size
ladder in a process of its own. `attnserve bench` is the user's
tool and stays in the package (attnserve/clients/bench.py).
"""
