"""The engine: continuous batching over a slot runner. Requests, slots, token ids, logits,
sampling and detokenizing; numpy and the tokenizer only, no ONNX Runtime, gRPC or protobuf.

engine.py (the scheduler and its thread) -> sequence.py (one request's tokens, events and mailbox) ->
sampling.py (one request's sampler, masked by grammar.py's structured output; host_draw.py its draw over a
row: which ids min-p, top-k and top-p keep, and the pick, whole_draw.py the same draw compiled from
whole_draw.c for rows with no top-k, and a greedy row's log-probabilities; likeliest.py the few ids a top-k
draw needs (and, without the compiled library, a greedy row's top log-probabilities); host_picks.py a step's
host rows picked together, batch_draw.py their draws) and detokenizer.py (its text, with stop strings).
step_plan.py: the scheduler's decision for a step's decoding, a value (one step, a burst, or a
verification). burst.py: greedy decode steps run back to back, and when each request takes its tokens;
ahead_rule.py: when a burst runs ahead (its next step computed while the engine takes the last one's
tokens). speculation.py: --speculative-config, prompt lookup's proposals and a request's pauses;
drafting.py: a draft model's proposals, from its own runner; step_costs.py: whether a verification gave more
tokens a second than plain steps. beam_group.py: a beam search request's k slots, whose beams beam_search.py
picks (pure numpy, as transformers' beam search; export's beam gate runs it too). search.py is the one
interface the engine hands a step's rows to: a completion (its own search) or a beam group; no slot is
routed by its type. outbox.py is where each step's events go: the callers' event loops, or the engine core's
channel (attnserve/core/). seam.py is the seam: what the engine may know of a model (ModelSpec) and what it
asks of a runner (SlotRunner: rows of logits, or the picks of its batched pass, PassRow and Pick). domain.py
holds the plain requests, events and errors the front doors share. tests/test_engine.py drives it over a
fake runner in milliseconds.
"""
