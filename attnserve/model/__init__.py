"""The transformer of the lectures, in PyTorch: layers, models, training, and import from Hugging Face.

Knows nothing of ONNX or gRPC.

The models: config.py (ModelConfig, one dataclass, and its presets) -> attention.py (scaled dot-product
and multi-head attention, and their masks), positional.py (sinusoidal, learned and rotary positions),
layers.py (feed-forward, encoder and decoder layers) -> lm.py (the decoder-only language model, its KV
cache a value) and seq2seq.py (the encoder-decoder). checkpoint.py saves and loads them, checked against
their config; generate.py is the reference decoding that exported graphs and the server are compared with.

Training: train_cli.py (`attnserve train`) runs an architecture's Task through trainer.py (the one loop:
budget, checkpoints, resume, DDP), with schedule.py (warm-up, then cosine decay), distributed.py (torchrun's
ranks and devices) and progress.py (the progress bar). The decoder's Task is train.py, on data.py's corpus
windows; the encoder-decoder's is train_seq2seq.py, on numbers.py's pairs (numbers into English words, or
a file of pairs). attention_map.py (`attnserve attention-map`) draws an encoder-decoder's cross-attention.

Import: hf/ (`attnserve import`) reads a Hugging Face checkpoint's files as untrusted input, maps them
onto this model (GPT-2, the Llama family, Marian) and proves the result against transformers before
writing it.
"""
