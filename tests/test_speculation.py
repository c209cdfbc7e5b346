"""Speculative decoding by prompt lookup (engine/speculation.py): the real Engine over test_engine's
FakeRunner, whose verify feeds every proposal and whose rewind forgets them, so that a request that
kept a wrong proposal, or lost one of its ids, decodes something else than it does alone. The
arena's verification against its own single steps is tests/test_speculation_arena.py's."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_engine import COPY_PERIOD, EOS_AT, FakeRunner, alone, ask, served

from attnserve.engine.domain import Final, FinishReason, GenerationRequest, SamplingParams
from attnserve.engine.speculation import FIRST_PAUSE, MISSES, Lookup, Speculation, accepted, parse_speculation

SPECULATION = Speculation(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=1, disable_by_batch_size=4)


def test_a_lookup_proposes_what_followed_the_latest_earlier_occurrence_of_its_longest_suffix():
    lookup = Lookup(SPECULATION, (1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3))
    # (5, 2, 3) occurred nowhere before; (2, 3) last before the suffix at 5..6, followed by 7, 8, 5, 2
    assert lookup.propose(10) == (7, 8, 5, 2)
    assert lookup.propose(2) == (7, 8)
    lookup.append(4)  # ... 2, 3, 4: (3, 4) and (4,) never occurred
    assert lookup.propose(10) == ()
    # a stretch that repeats goes on repeating: (6, 6) ends at 2, was last before at 1, followed by 6
    assert Lookup(SPECULATION, (6, 6)).propose(4) == (6, 6, 6, 6)
    assert Lookup(SPECULATION, (1, 2, 3, 1, 2, 3, 1)).propose(4) == (2, 3, 1, 2)
    assert Lookup(SPECULATION, ()).propose(4) == ()


def test_a_lookup_pauses_after_misses_for_twice_as_long_each_time_and_a_kept_proposal_resumes_it():
    lookup = Lookup(SPECULATION, (1, 2, 1, 2))
    for pause in (FIRST_PAUSE, 2 * FIRST_PAUSE):
        for _ in range(MISSES):
            assert lookup.propose(4)
            lookup.record(2, 0)
        assert lookup.pause == pause and lookup.propose(4) == ()
        lookup.passed(pause)
    lookup.record(3, 1)
    assert (lookup.proposed, lookup.accepted) == (2 * MISSES * 2 + 3, 1)
    lookup.record(2, 0)
    assert lookup.pause == 0  # one miss after a kept proposal: no pause yet


def test_accepted_counts_the_proposals_equal_to_the_argmax_before_each():
    assert accepted((5, 6, 7), [5, 6, 7, 8]) == 3
    assert accepted((5, 6, 7), [5, 9, 7, 8]) == 1
    assert accepted((5,), [4, 5]) == 0
    assert accepted((), [4]) == 0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "must be a JSON object"),
        ("[1]", "must be a JSON object"),
        ('{"method": "eagle"}', "method must be 'ngram'"),
        ('{"model": "models/small"}', "a draft model ('model') is not supported yet"),
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be 1 to 16, not 0"),
        ('{"num_speculative_tokens": 17}', "num_speculative_tokens must be 1 to 16, not 17"),
        ('{"num_speculative_tokens": 2.5}', "num_speculative_tokens must be a whole number, not 2.5"),
        ('{"prompt_lookup_max": 2, "prompt_lookup_min": 3}', "prompt_lookup_min must be 1 to prompt_lookup_max (2)"),
        ('{"prompt_lookup_max": 40}', "prompt_lookup_max must be 1 to 16, not 40"),
        ('{"disable_by_batch_size": 0}', "disable_by_batch_size must be at least 1, not 0"),
        ('{"num_speculative_token": 4}', "unknown key 'num_speculative_token'"),
    ],
)
def test_a_bad_speculative_config_is_refused_in_one_line_naming_the_key_and_its_limit(text, why):
    with pytest.raises(ValueError, match=r"^--speculative-config") as error:
        parse_speculation(text)
    assert why in str(error.value) and "\n" not in str(error.value)


def test_a_speculative_config_takes_vllms_keys_and_fills_the_rest():
    assert parse_speculation('{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3}') == Speculation(
        num_speculative_tokens=6, prompt_lookup_max=3, prompt_lookup_min=1
    )
    assert parse_speculation('{"prompt_lookup_min": 5}') == Speculation(prompt_lookup_max=5, prompt_lookup_min=5)
    assert parse_speculation("{}") == Speculation()


def copying(prompt: str, max_new_tokens: int):
    """A request the fake model answers by copying its prompt's last COPY_PERIOD ids over and over."""
    assert prompt.startswith("^") and len(prompt) > COPY_PERIOD
    return ask(prompt, max_new_tokens)


def test_a_copying_request_keeps_its_proposals_and_gets_what_it_gets_alone_in_fewer_steps():
    runner = FakeRunner(capacity=2)
    asks = [copying("^hello world", 40)]
    ((tokens, final),) = served(runner, asks, SPECULATION)
    assert tokens == alone(asks[0].prompt_ids, 40)
    assert isinstance(final, Final) and final.reason is FinishReason.LENGTH and final.usage.completion_tokens == 40
    verifies = [entry for entry in runner.log if entry[0] == "verify"]
    # 5 tokens a step (4 kept proposals and the model's next), but at the budget's end: 39 after the prefill's
    assert [len(step[0]) for step in runner.verified] == [4] * 7 + [3] and len(verifies) == 8
    assert not [entry for entry in runner.log if entry[0] == "rewind"]


def test_proposals_never_run_past_the_budget_and_the_eos_inside_kept_ones_ends_the_request():
    runner = FakeRunner(capacity=2)
    for budget in (1, 2, 7, 9):
        ((tokens, final),) = served(runner, [copying("^abcdeabcde", budget)], SPECULATION)
        assert tokens == alone(tuple(b"^abcdeabcde"), budget) and final.usage.completion_tokens == budget
        assert all(len(p) <= budget - 1 for step in runner.verified for p in step.values())
    ends = "!" + "x" * (EOS_AT - 3)  # EOS after one more id; "x" repeats: proposals of x's
    ((tokens, final),) = served(FakeRunner(capacity=2), [ask(ends, 20)], SPECULATION)
    assert tokens == alone(tuple(ends.encode()), 20) and final.reason is FinishReason.EOS


def test_wrong_proposals_are_forgotten_and_every_request_in_the_batch_gets_what_it_gets_alone():
    """Random-looking requests beside copying ones, four in a batch: one whose prompt holds every letter
    proposes the letters that follow its last one there, which the fake's model rarely picks; rejected
    proposals are rewound, and every request's tokens are its tokens alone."""
    runner = FakeRunner(capacity=4)
    letters = "abcdefghijklmnopqrstuvwxyz"
    asks = [ask(letters, 30), copying("^ab cd ab", 33), ask("x", 25), copying("^0123456", 28), ask("Return", 12)]
    outcomes = served(runner, asks, SPECULATION)
    for a, (tokens, final) in zip(asks, outcomes):
        assert tokens == alone(a.prompt_ids, a.max_new_tokens), a.prompt
        assert isinstance(final, Final) and final.usage.completion_tokens == len(tokens)
    assert [entry for entry in runner.log if entry[0] == "rewind"], "some proposals failed"
    assert any(len(p) > 1 for step in runner.verified for p in step.values())


def test_a_request_whose_proposals_fail_pauses_them_and_decodes_in_bursts():
    """A prompt that holds every letter: the lookup proposes what follows the model's letter there, which the
    fake's model does not pick; after MISSES such steps the request decodes a burst of FIRST_PAUSE steps,
    then after MISSES more one twice as long."""
    runner = FakeRunner(capacity=2)
    asks = [ask("abcdefghijklmnopqrstuvwxyz", 90)]
    ((tokens, _),) = served(runner, asks, SPECULATION)
    assert tokens == alone(asks[0].prompt_ids, 90)
    kinds = [entry[0] for entry in runner.log if entry[0] != "decode"]
    missed = ["verify", "rewind"] * MISSES
    assert kinds[1 : 3 + 4 * MISSES] == [*missed, "burst", *missed, "burst"]
    assert runner.bursts[:2] == [FIRST_PAUSE, 2 * FIRST_PAUSE]


def test_above_disable_by_batch_size_nothing_is_proposed():
    runner = FakeRunner(capacity=3)
    asks = [copying("^hello world", 20), copying("^hello there", 20)]
    outcomes = served(runner, asks, Speculation(disable_by_batch_size=1))
    assert [tokens for tokens, _ in outcomes] == [alone(a.prompt_ids, 20) for a in asks]
    # both decode together from the first step to the last: never alone, so never a verification
    assert not [entry for entry in runner.log if entry[0] == "verify"]


def test_a_stop_string_inside_kept_proposals_ends_the_request_where_it_ends_without_them():
    """The copy keeps 4 proposals a step; the stop string completes in the middle of a step's tokens: the
    request ends there, with the text and ids it has without speculation, the later tokens dropped."""
    stopped = [replace(copying("^hello world", 40), stop=("rldwo",)), replace(copying("^0123456", 30), stop=("56234",))]
    for a in stopped:
        ((tokens, final),) = served(FakeRunner(capacity=2), [a], SPECULATION)
        ((alone_tokens, alone_final),) = served(FakeRunner(capacity=2), [a])
        assert (tokens, final.reason, final.text, final.usage) == (
            alone_tokens,
            alone_final.reason,
            alone_final.text,
            alone_final.usage,
        )
        assert final.reason is FinishReason.STOP and 0 < len(tokens) < a.max_new_tokens


def test_a_request_that_samples_or_asks_logprobs_never_proposes_and_its_batch_does_not_verify():
    """Beside a sampled request (or one with logprobs, or ignore_eos), a copying one decodes step by step
    with the batch: a verification runs only while every decoding request is plain greedy, and only the
    copying request proposes once it decodes alone."""
    sampled = GenerationRequest("s", tuple(b"sampled"), 10, SamplingParams(temperature=0.8, seed=1), interval=None)
    others = [sampled, replace(ask("logprobs", 10), logprobs=2), replace(ask("fixed", 10), ignore_eos=True)]
    for other in others:
        runner = FakeRunner(capacity=2)
        outcomes = served(runner, [copying("^hello world", 30), other], SPECULATION)
        assert outcomes[0][0] == alone(tuple(b"^hello world"), 30)
        assert isinstance(outcomes[1][1], Final) and outcomes[1][1].usage.completion_tokens == 10
        first_verify = next(i for i, entry in enumerate(runner.log) if entry[0] == "verify")
        assert ("release", 1) in runner.log[:first_verify], "no verification while the other decodes"
        assert all(set(step) == {0} for step in runner.verified)
