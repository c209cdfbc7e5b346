"""Speculative decoding by prompt lookup (engine/speculation.py): the real Engine over test_engine's
FakeRunner, whose verify feeds every proposal and whose rewind forgets them, so that a request that
kept a wrong proposal, or lost one of its ids, decodes something else than it does alone. The
arena's verification against its own single steps is tests/test_speculation_arena.py's."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest
from test_engine import COPY_PERIOD, EOS_AT, SPEC, WAIT_S, FakeRunner, alone, ask, next_id, running, served

from attnserve.engine.domain import BeamParams, Delta, Final, FinishReason, GenerationRequest, SamplingParams
from attnserve.engine.host_draw import kept
from attnserve.engine.speculation import FIRST_PAUSE, MISSES, Lookup, Speculation, parse_speculation
from attnserve.engine.step_costs import PROBE_EVERY, SMOOTHING, StepCosts

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


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "must be a JSON object"),
        ("[1]", "must be a JSON object"),
        ('{"method": "eagle"}', "method must be 'ngram' (prompt lookup) or 'draft_model' (with a model)"),
        ('{"model": ""}', "model must be a model directory's path, not ''"),
        ('{"model": 3}', "model must be a model directory's path, not 3"),
        ('{"method": "draft_model"}', "a model goes with method 'draft_model', and only with it"),
        ('{"method": "ngram", "model": "models/small"}', "a model goes with method 'draft_model', and only with it"),
        ('{"model": "models/small", "prompt_lookup_max": 3}', "prompt_lookup_max is for method 'ngram', not a draft"),
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
    assert parse_speculation('{"model": "models/small", "num_speculative_tokens": 3}') == Speculation(
        num_speculative_tokens=3, method="draft_model", model="models/small"
    )


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
    # the first decode step a plain one, timed (step_costs.py); then 5 tokens a verification (4 kept
    # proposals and the model's next), but at the budget's end: 38 after the prefill's and that step's
    assert runner.bursts[0] == 1 and [entry[0] for entry in runner.log].index("burst") < runner.log.index(verifies[0])
    assert [len(step[0]) for step in runner.verified] == [4] * 7 + [2] and len(verifies) == 8
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
    then after MISSES more one twice as long (its first decode step a plain one, timed: step_costs.py)."""
    runner = FakeRunner(capacity=2)
    asks = [ask("abcdefghijklmnopqrstuvwxyz", 90)]
    ((tokens, _),) = served(runner, asks, SPECULATION)
    assert tokens == alone(asks[0].prompt_ids, 90)
    kinds = [entry[0] for entry in runner.log if entry[0] != "decode"]
    missed = ["verify", "rewind"] * MISSES
    assert kinds[1 : 4 + 4 * MISSES] == ["burst", *missed, "burst", *missed, "burst"]
    assert runner.bursts[:3] == [1, FIRST_PAUSE, 2 * FIRST_PAUSE]


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


class GradedRunner(FakeRunner):
    """The fake model with a runner-up: its id's logit 2, the next id's 1, every other 0. At temperature 1
    with min_p 0.3 a draw keeps those two: its id with e / (e + 1), the next with 1 / (e + 1)."""

    def _logits(self, key: int) -> np.ndarray:
        return graded_row(self.model(self.rows[key]))


def graded_row(token: int) -> np.ndarray:
    """GradedRunner's row where the fake model's id is `token`."""
    row = np.zeros(SPEC.vocab_size, np.float32)
    row[token], row[(token + 1) % row.size] = 2.0, 1.0
    return row


def sampled(prompt: str, max_new_tokens: int, seed: int, **controls) -> GenerationRequest:
    """A seeded draw of GradedRunner's model (temperature 1, min_p 0.3: two ids a step), with `controls`."""
    params = SamplingParams(temperature=1.0, min_p=0.3, seed=seed)
    return replace(ask(prompt, max_new_tokens), sampling=params, **controls)


def served_with_logprobs(
    runner: FakeRunner,
    asks: list[GenerationRequest],
    speculation: Speculation | None,
    draft: FakeRunner | None = None,
):
    """Each request's Deltas' ids and logprobs, and its Final's reason, text, usage and speculated counts."""

    async def main():
        with running(runner, max_queue=len(asks), speculation=speculation, draft=draft) as engine:
            handles = [engine.submit(a) for a in asks]
            engine.start()
            results = []
            for handle in handles:
                ids, logprobs, final = [], [], None
                while final is None:
                    for event in await asyncio.wait_for(handle.next_events(), WAIT_S):
                        assert not isinstance(event, Exception), event
                        if isinstance(event, Delta):
                            ids += event.token_ids
                            logprobs += event.logprobs
                        else:
                            final = event
                results.append((ids, logprobs, final.reason, final.text, final.usage, final.speculated))
            return results

    return asyncio.run(main())


def test_sampled_requests_verify_their_proposals_and_each_gets_the_tokens_it_gets_without_speculation():
    """Seeded draws (with penalties, logprobs, bans, a stop string) beside greedy ones, four at a time:
    with speculation each request's proposals are verified from its rows and it picks, by its own seeded
    draw, every token it picks without, logprobs and text included; some proposals are kept, some not."""
    copy = "^abcdeabcde"
    asks = [
        sampled(copy, 30, seed=1),
        sampled(copy, 30, seed=2, logprobs=2),
        replace(ask(copy, 24), sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=3, repetition_penalty=1.1)),
        replace(ask(copy, 24), sampling=SamplingParams(temperature=1, top_k=2, seed=4, presence_penalty=0.2)),
        replace(copying("^hello world", 26), logprobs=1),
        replace(copying("^hello world", 26), ignore_eos=True),
        sampled("!" + "x" * (EOS_AT - 4), 20, seed=5, min_new_tokens=6),
        sampled(copy, 40, seed=6, stop=("dea",)),
        sampled("abcdefghijklmnopqrstuvwxyz", 20, seed=7),
    ]
    speculation = replace(SPECULATION, disable_by_batch_size=4)
    runner = GradedRunner(capacity=4)
    on = served_with_logprobs(runner, asks, speculation)
    off = served_with_logprobs(GradedRunner(capacity=4), asks, None)
    for a, with_it, without in zip(asks, on, off):
        assert with_it[:5] == without[:5], a.prompt
        assert with_it[5] is not None and without[5] is None
    assert sum(with_it[5][1] for with_it in on) > 0, "some proposals kept"
    assert [entry for entry in runner.log if entry[0] == "rewind"], "some proposals rejected"
    assert any(rows for rows in runner.verified_rows), "sampled rows verified"
    assert on[1][1] and len(on[1][1]) == len(on[1][0]), "a logprob for every token"


def outcomes_of(history: list[int], steps: int, min_p: float) -> dict[tuple[int, ...], float]:
    """GradedRunner's model drawn `steps` times after `history` (temperature 1, min_p), without speculation:
    each sequence of ids and its probability, from the ids and weights the sampler keeps (sampling.kept)."""
    if steps == 0:
        return {(): 1.0}
    keep, shifted = kept(graded_row(next_id(history)).astype(np.float64), min_p, 0, 1.0)
    ids = np.flatnonzero(keep)
    weights = np.exp(shifted[ids]) / np.exp(shifted[ids]).sum()
    out: dict[tuple[int, ...], float] = {}
    for token, weight in zip(ids.tolist(), weights.tolist()):
        for rest, p in outcomes_of([*history, token], steps - 1, min_p).items():
            out[(token, *rest)] = out.get((token, *rest), 0.0) + weight * p
    return out


CHI_SQUARE_999 = {15: 37.697}  # the chi-square distribution's 99.9th percentile by degrees of freedom


def test_sampled_speculation_keeps_the_models_distribution_by_a_chi_square_test():
    """3,000 draws of 4 ids (the first from the prefill, the other 3 from verifications of the lookup's
    proposals, which each id keeps with the model's probability of it), 64 at a time: the 16 sequences'
    counts against their probabilities without speculation, by Pearson's chi-square (15 degrees of
    freedom, below its 99.9th percentile). Seeded 0 to 2,999: the test is the same on every run."""
    prompt, draws = "^abcdeabcd", 3000
    expected = outcomes_of(list(prompt.encode()), 4, min_p=0.3)
    assert len(expected) == 16
    runner = GradedRunner(capacity=64)
    asks = [sampled(prompt, 4, seed=seed) for seed in range(draws)]
    results = served_with_logprobs(runner, asks, replace(SPECULATION, disable_by_batch_size=64))
    counts: dict[tuple[int, ...], int] = {}
    for ids, *_ in results:
        counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1
    assert set(counts) <= set(expected)
    chi_square = sum((counts.get(ids, 0) - draws * p) ** 2 / (draws * p) for ids, p in expected.items())
    assert chi_square < CHI_SQUARE_999[len(expected) - 1], (chi_square, counts)
    proposed, kept_ids = (sum(result[5][i] for result in results) for i in (0, 1))
    assert 0 < kept_ids < proposed and len([step for step in runner.verified if step]) > 0
    # a verification that kept every proposal would give the lookup's copy far too often
    always = max(expected, key=expected.get)
    assert counts[always] < draws * (expected[always] + 0.05)


def test_a_beam_search_beside_a_copying_request_keeps_the_batch_from_verifying():
    """A beam search takes no part in a verification: while its beams decode, the copying request
    decodes step by step with them, and it verifies once it decodes alone."""
    runner = FakeRunner(capacity=3)
    beams = replace(ask("beams", 8), beams=BeamParams(num_beams=2), interval=None)
    speculation = replace(SPECULATION, disable_by_batch_size=4)
    outcomes = served(runner, [copying("^hello world", 40), beams], speculation)
    assert outcomes[0][0] == alone(tuple(b"^hello world"), 40)
    assert isinstance(outcomes[1][1], Final)
    verifies = [i for i, entry in enumerate(runner.log) if entry[0] == "verify"]
    released = [i for i, entry in enumerate(runner.log) if entry[0] == "release" and entry[1] in (1, 2)]
    assert verifies and released and min(verifies) > max(released)


DRAFTING = Speculation(num_speculative_tokens=4, disable_by_batch_size=4, method="draft_model", model="the fake")


def draft_model(wrong_every: int):
    """A draft of the fake model: its next id, but the next letter where the history's length is a
    multiple of `wrong_every` (0: never)."""

    def model(history: list[int]) -> int:
        token = next_id(history)
        return token + 1 if wrong_every and len(history) % wrong_every == 0 else token

    return model


def drafting(capacity: int, wrong_every: int) -> FakeRunner:
    runner = FakeRunner(capacity)
    runner.model = draft_model(wrong_every)
    return runner


class CheckedTarget(GradedRunner):
    """The fake target (with GradedRunner's runner-up), which checks every proposal it verifies against the
    draft model's greedy ids after the request's whole history: a draft slot that lost or kept a wrong id
    would propose something else."""

    def __init__(self, capacity: int, draft: FakeRunner):
        super().__init__(capacity)
        self.draft, self.mismatches = draft, []

    def verify(self, next_ids, proposals, sampled=frozenset()):
        for key, proposal in proposals.items():
            history, expected = [*self.rows[key], next_ids[key]], []
            for _ in proposal:
                expected.append(self.draft.model(history))
                history.append(expected[-1])
            if list(proposal) != expected:
                self.mismatches.append((key, proposal, tuple(expected)))
        return super().verify(next_ids, proposals, sampled)


def test_a_draft_model_that_agrees_with_the_target_has_every_proposal_kept():
    """The draft is the target's own model: every proposal is kept (5 tokens a verification), the draft's
    slot is prefilled once a request and then fed two ids a proposal (the last proposal it never ran,
    and the target's next token), and every request gets what it gets alone."""
    draft = drafting(3, wrong_every=0)
    runner = CheckedTarget(3, draft)
    asks = [ask("abc", 30), ask("hello", 21), copying("^hello world", 26)]
    outcomes = served(runner, asks, DRAFTING, draft)
    for a, (tokens, final) in zip(asks, outcomes):
        assert tokens == alone(a.prompt_ids, a.max_new_tokens) and final.speculated[0] == final.speculated[1] > 0
    assert not runner.mismatches and not [entry for entry in runner.log if entry[0] == "rewind"]
    assert [entry[0] for entry in draft.log].count("start") == len(asks)
    assert not [entry for entry in draft.log if entry[0] == "rewind"]
    assert any(len(step.get(key, ())) == 1 for step in draft.verified for key in step), "two ids fed at once"


@pytest.mark.parametrize("wrong_every", [2, 3, 7])
def test_a_draft_model_that_is_sometimes_wrong_gives_every_request_what_it_gets_without_speculation(wrong_every):
    """Greedy and seeded draws, four at a time: the target keeps the right proposals and draws its own token
    where one is wrong; both slots forget what was not kept, and every later proposal is the draft's
    greedy continuation of the request's true history."""
    asks = [
        ask("abc", 30),
        sampled("^abcdeabcde", 30, seed=1, logprobs=2),
        replace(copying("^hello world", 26), ignore_eos=True),
        sampled("xyz", 25, seed=2),
        sampled("^0123456", 40, seed=3, stop=("2345",)),
    ]
    draft = drafting(4, wrong_every)
    runner = CheckedTarget(4, draft)
    on = served_with_logprobs(runner, asks, DRAFTING, draft)
    off = served_with_logprobs(GradedRunner(4), asks, None)
    assert [result[:5] for result in on] == [result[:5] for result in off]
    assert not runner.mismatches
    proposed, kept_ids = (sum(result[5][i] for result in on) for i in (0, 1))
    assert 0 < kept_ids < proposed
    assert [entry for entry in draft.log if entry[0] == "rewind"] and [e for e in runner.log if e[0] == "rewind"]


def test_a_request_whose_draft_keeps_failing_keeps_its_draft_slot_through_its_pauses_and_catches_up():
    """A draft wrong at every id: after MISSES verifications the request pauses; when it proposes again
    its draft slot, prefilled once, is fed every id the history gained meanwhile in one run, and the
    draft's proposals are still its greedy continuation of the request's true history."""
    draft = drafting(2, wrong_every=1)
    runner = CheckedTarget(2, draft)
    ((tokens, _),) = served(runner, [ask("abc", 60)], DRAFTING, draft)
    assert tokens == alone(tuple(b"abc"), 60) and not runner.mismatches
    assert [entry[0] for entry in draft.log].count("start") == 1 and ("release", 0) in draft.log
    assert runner.bursts[:2] == [1, FIRST_PAUSE]
    assert any(len(step.get(0, ())) >= FIRST_PAUSE for step in draft.verified), "a pause's ids fed in one run"


def test_step_costs_judge_a_verification_by_the_tokens_plain_steps_give_in_its_time():
    costs = StepCosts()
    assert costs.probe(2) and costs.verified(2, 10, 1.0) is None  # plain steps of 2 never timed
    costs.ran_plain(2, 0.5)  # 2 tokens in 0.5 s: 4 a second
    assert costs.verified(2, 4, 1.0) is True and costs.verified(2, 3, 1.0) is False
    costs.ran_plain(2, 1.5)  # the average moves by SMOOTHING: 0.75
    assert costs.plain[2] == pytest.approx(0.5 + SMOOTHING * 1.0)
    costs.ran_plain(2, 0.5)
    for _ in range(PROBE_EVERY):
        assert not costs.probe(2)
        costs.verified(2, 4, 1.0)
    assert costs.probe(2) and costs.probe(3)


def kinds_of(runner: FakeRunner) -> list:
    """The runner's verify calls and bursts (with their steps), in order."""
    return [entry[0] if entry[0] == "verify" else entry for entry in runner.log if entry[0] in ("verify", "burst")]


def test_verifications_that_give_fewer_tokens_a_second_than_plain_steps_pause_the_request():
    """One proposal a verification, always kept (2 tokens), but a verification takes 3 plain steps' time:
    the first decode step is a plain one, timed, and the MISSES verifications after it, which did not pay,
    pause the request for FIRST_PAUSE steps; then again, twice as long. Its tokens are its tokens alone."""
    runner = FakeRunner(capacity=2)
    runner.verify_cost = 3.0
    slow = Speculation(num_speculative_tokens=1, prompt_lookup_max=3, disable_by_batch_size=4)
    ((tokens, _),) = served(runner, [copying("^hello world", 80)], slow)
    assert tokens == alone(tuple(b"^hello world"), 80)
    missed = ["verify"] * MISSES
    assert kinds_of(runner)[: 1 + 2 * (MISSES + 1)] == [
        ("burst", 1),
        *missed,
        ("burst", FIRST_PAUSE),
        *missed,
        ("burst", 2 * FIRST_PAUSE),
    ]


def test_verifications_that_pay_go_on_with_a_plain_step_timed_now_and_then():
    """Five tokens a verification at 1.5 plain steps' time: the request never pauses; a plain step is timed
    first, then again every PROBE_EVERY verifications."""
    runner = FakeRunner(capacity=2)
    runner.verify_cost = 1.5
    ((tokens, _),) = served(runner, [copying("^hello world", 110)], replace(SPECULATION, disable_by_batch_size=4))
    assert tokens == alone(tuple(b"^hello world"), 110)
    kinds = kinds_of(runner)
    assert kinds[: PROBE_EVERY + 2] == [("burst", 1), *["verify"] * PROBE_EVERY, ("burst", 1)]
    assert set(kinds) == {"verify", ("burst", 1)} and kinds.count("verify") > PROBE_EVERY + 1


def test_with_a_draft_model_a_new_request_goes_on_with_the_pauses_the_last_one_ended_with():
    """Two requests one after the other whose draft is always wrong: the second waits out what the first
    left of its pause, and its first misses pause it for as long as the first's next misses would have,
    not FIRST_PAUSE again (a draft's worth is the pair's; prompt lookup's is each request's own, and each
    starts afresh)."""
    draft = drafting(1, wrong_every=1)
    runner = CheckedTarget(1, draft)
    asks = [ask("abc", 60), ask("xyz", 90)]  # room for the second's next pause (a burst stops at a budget's end)
    outcomes = served(runner, asks, DRAFTING, draft)
    assert [tokens for tokens, _ in outcomes] == [alone(a.prompt_ids, a.max_new_tokens) for a in asks]
    assert not runner.mismatches  # the second's draft slot caught up after a pause longer than CATCH_UP
    second = next(i for i, entry in enumerate(runner.log) if entry[0] == "start" and entry[1] == 1)
    asked = [entry[1] for entry in runner.log[:second] if entry[0] == "burst"]  # the steps each burst was let run
    # the first decode step a plain one, timed; then MISSES misses before each pause, 8, 16, then 32, cut
    # short by the request's budget (no burst runs past one): 60 = 1 (prefill) + 1 + 3 x MISSES + 8 + 16 + 28
    assert asked == [1, FIRST_PAUSE, 2 * FIRST_PAUSE, 28] and runner.bursts[3] == 28
    then = [
        entry[0] if entry[0] != "burst" else entry for entry in runner.log[second:] if entry[0] in ("verify", "burst")
    ]
    assert then[: 2 + MISSES] == [("burst", 32 - 28), *["verify"] * MISSES, ("burst", 8 * FIRST_PAUSE)]
