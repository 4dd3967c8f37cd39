"""The exchange, driven the Playbook way: the commands it yields and the replies it is given, with
no server and no sockets (`tests.core.playbook`)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any
from weakref import WeakKeyDictionary

from proxy.core.commands import (
    Answered,
    ChooseTokenizer,
    Chosen,
    Delivered,
    FindRoute,
    Held,
    LookUpCorrection,
    LookUpHeld,
    Note,
    PlanFor,
    ProviderCount,
    Recount,
    Recounted,
    Reject,
    Relay,
    Remember,
    Render,
    Routed,
    Send,
    Summarise,
    Summary,
)
from proxy.core.exchange import Exchange
from proxy.core.learning.corrections import Correction
from proxy.core.plan import Plan
from tests.core.playbook import Playbook
from tests.support.trimming import fit, words

WINDOW = 16_000


def conversation(turns: int, tokens: int = 100) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}: " + words(tokens)})
        messages.append({"role": "assistant", "content": f"answer {i}: " + words(tokens, "ipsum")})
    messages.append({"role": "user", "content": "And now?"})
    return {"model": "gpt-4o", "messages": messages}


def overflow(limit: int, prompt: int) -> Answered:
    """OpenAI's own words for a prompt over the model's window."""
    message = (
        f"This model's maximum context length is {limit} tokens. However, your messages resulted in {prompt} tokens."
    )
    error = {"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}}
    return Answered(400, json.dumps(error).encode(), b'{"model": "gpt-4o", "messages": []}')


ROUTES: WeakKeyDictionary[Exchange, tuple[Routed, Correction | None]] = WeakKeyDictionary()


def exchange(
    mode: str = "enforce",
    *,
    window: int | None = None,
    correction: Correction | None = None,
    provider_counts: bool = False,
    recounts: bool = False,
    **options: Any,
) -> Exchange:
    """An exchange whose route will say the model's window is `WINDOW` (or that the request opts
    into `window`), counted by the model's own tokenizer (by the backend's with `recounts`), and
    whose correction lookup will find `correction`; `book` answers those first three commands."""
    made = Exchange(mode, **options)  # type: ignore[arg-type]
    source = "backend" if recounts else "model"
    ROUTES[made] = (
        Routed(
            WINDOW if window is None else window // 2,  # the model map's, smaller than the one opted into
            "model_map",
            opt_in_window=window,
            provider_counts=provider_counts,
            chosen=Chosen(source, recounts=recounts),
        ),
        correction,
    )
    return made


def book(machine: Exchange) -> Playbook:
    """The playbook of `machine` from its first plan on: its route found and its correction looked up."""
    routed, correction = ROUTES[machine]
    return Playbook(machine) << FindRoute() >> routed << LookUpCorrection() >> correction


def sending(plan: Plan, attempt: int = 1, outcome: str | None = None) -> Send:
    outcome = outcome or plan.result.outcome
    return Send(plan.request if plan.result.changed else None, plan, attempt, outcome)


FITS = fit(conversation(30), WINDOW)  # about 6,000 tokens
TRIMMED = fit(conversation(30), 3_000)


class TestPlanAndForward:
    def test_a_request_that_fits_is_planned_for_the_models_window_and_sent_as_it_came(self):
        assert FITS.result.outcome == "unchanged"
        assert book(exchange()) << PlanFor(None) >> FITS << Send(None, FITS, 1, "unchanged") >> Delivered() << None

    def test_a_trimmed_request_is_sent_in_its_own_shape(self):
        """The plan's rendered body is what goes out; nothing rewrites the plan after the fact."""
        rendered = replace(TRIMMED, body={**TRIMMED.result.body, "rendered": True})
        assert book(exchange()) << PlanFor(None) >> rendered << Send(rendered.body, rendered, 1, "trimmed")

    def test_a_correction_learned_earlier_plans_for_its_window(self):
        earlier = exchange()
        assert book(earlier) << PlanFor(None) >> FITS << Send >> overflow(4096, 6100) << PlanFor
        assert earlier.learned is not None
        assert book(exchange(correction=earlier.learned)) << PlanFor(earlier.learned.window)


class TestReject:
    def test_a_request_nothing_more_may_be_cut_from_is_rejected_and_never_sent(self):
        system = {"role": "system", "content": words(5_000)}  # never cut
        huge = fit({"model": "gpt-4o", "messages": [system, {"role": "user", "content": "Hi"}]}, 1_000)
        assert huge.result.outcome == "rejected"
        assert book(exchange()) << PlanFor(None) >> huge << Reject(huge)


class TestSelfCorrection:
    def test_an_upstream_overflow_is_corrected_retried_once_and_remembered_when_the_retry_wins(self):
        machine = exchange()
        assert (
            book(machine)
            << PlanFor(None)
            >> FITS
            << sending(FITS)
            >> overflow(4096, 6100)
            << (lambda c: isinstance(c, PlanFor) and c.window is not None and c.window < 4096)
            >> TRIMMED
            << sending(TRIMMED, attempt=2)
            >> Delivered()
            << (lambda c: isinstance(c, Remember) and c.correction.limit == 4096)
            >> None
            << None
        )
        assert machine.attempt == 2

    def test_a_second_overflow_is_relayed(self):
        """Only one retry: the upstream's error to the retry reaches the client as it came."""
        assert (
            book(exchange())
            << PlanFor(None)
            >> FITS
            << Send
            >> overflow(4096, 6100)
            << PlanFor
            >> TRIMMED
            << sending(TRIMMED, attempt=2)
            >> overflow(2048, 3100)
            << Relay()
            >> None
            << None
        )

    def test_an_implausible_overflow_is_relayed_and_teaches_nothing(self):
        machine = exchange()
        assert book(machine) << PlanFor(None) >> FITS << Send >> overflow(100, 6100) << Relay() >> None << None
        assert machine.learned is None and machine.ignored_overflow == "implausible"

    def test_a_retry_that_cannot_cut_anything_is_not_sent(self):
        machine = exchange()
        assert book(machine) << PlanFor(None) >> FITS << Send >> overflow(4096, 6100) << PlanFor >> FITS << Relay()
        assert machine.ignored_overflow == "not_retried"

    def test_a_retry_the_client_did_not_have_whole_is_not_remembered(self):
        assert (
            book(exchange())
            << PlanFor(None)
            >> FITS
            << Send
            >> overflow(4096, 6100)
            << PlanFor
            >> TRIMMED
            << Send
            >> Delivered(whole=False)
            << None
        )

    def test_a_request_not_read_whole_remembers_only_the_stated_window(self):
        assert (
            book(exchange(read_whole=False))
            << PlanFor(None)
            >> FITS
            << Send
            >> overflow(4096, 6100)
            << PlanFor
            >> TRIMMED
            << Send
            >> Delivered()
            << (lambda c: isinstance(c, Remember) and c.correction.factor == 1.0 and c.correction.limit == 4096)
        )

    def test_a_request_counted_with_an_estimate_remembers_only_the_stated_window(self):
        """Its count had a part whose size was estimated (a medium): the provider's count, half as
        much again as the guard's, is about that request alone."""
        estimated = replace(TRIMMED, count=replace(TRIMMED.count, estimated=True))
        assert (
            book(exchange())
            << PlanFor(None)
            >> FITS
            << Send
            >> overflow(4096, 9000)
            << PlanFor
            >> estimated
            << Send
            >> Delivered()
            << (lambda c: isinstance(c, Remember) and c.correction.factor == 1.0 and c.correction.limit == 4096)
        )

    def test_a_smaller_window_the_retry_cannot_fit_is_kept_and_the_request_refused(self):
        """The provider's stated window is too small for what may not be cut: no retry proves it,
        but every later request would otherwise be sent for the window just refused."""
        system = {"role": "system", "content": words(5_000)}  # never cut
        huge = fit({"model": "gpt-4o", "messages": [system, {"role": "user", "content": "Hi"}]}, 4_000)
        machine = exchange()
        assert (
            book(machine)
            << PlanFor(None)
            >> FITS
            << Send
            >> overflow(4096, 6100)
            << PlanFor
            >> huge
            << (lambda c: isinstance(c, Remember) and c.correction.limit == 4096 and c.correction.factor == 1.0)
            >> None
            << Reject(huge)
        )
        assert machine.attempt == 2

    def test_an_overflow_that_states_no_smaller_window_and_cannot_be_retried_teaches_nothing(self):
        system = {"role": "system", "content": words(5_000)}
        huge = fit({"model": "gpt-4o", "messages": [system, {"role": "user", "content": "Hi"}]}, 4_000)
        assert (
            book(exchange())
            << PlanFor(None)
            >> FITS
            << Send
            >> overflow(WINDOW, 20_000)
            << PlanFor
            >> huge
            << Reject(huge)
        )


class TestOptedWindow:
    def test_a_window_the_request_opted_into_is_the_first_plans(self):
        assert book(exchange(window=WINDOW)) << PlanFor(WINDOW)

    def test_a_correction_learned_earlier_still_applies_to_it(self):
        earlier = exchange()
        assert book(earlier) << PlanFor(None) >> FITS << Send >> overflow(4096, 6100) << PlanFor
        assert earlier.learned is not None
        later = exchange(window=WINDOW, correction=earlier.learned)
        assert book(later) << PlanFor(earlier.learned.window)


class TestModes:
    def test_mode_off_sends_the_bytes_as_received_and_relays_any_error(self):
        assert book(exchange("off")) << Send(None, None) >> overflow(4096, 6100) << Relay() >> None << None

    def test_dry_run_sends_the_request_as_received_and_never_retries(self):
        assert (
            book(exchange("dry_run"))
            << PlanFor(None)
            >> TRIMMED
            << Send(None, TRIMMED, 1, "dry_run_trimmed")
            >> overflow(4096, 6100)
            << Relay()
        )


def bound(plan: Plan) -> Plan:
    """`plan` as made from a bound of the count (a model whose tokenizer is not public)."""
    return replace(plan, count=replace(plan.count, exact=False))


class TestProviderCount:
    """Where the choice of tokenizer allows it (bounds, not the backend's own count), the upstream's
    count endpoint is asked about the first plan, once, when it was made from a bound; its answer
    re-decides the request."""

    def test_an_exchange_not_told_the_choice_allows_it_asks_no_provider(self):
        assert book(exchange()) << PlanFor(None) >> bound(TRIMMED) << sending(bound(TRIMMED))

    def test_the_first_plan_is_offered_to_the_provider_count(self):
        trimmed = bound(TRIMMED)
        assert book(exchange(provider_counts=True)) << PlanFor(None) >> trimmed << ProviderCount(trimmed)

    def test_an_exact_count_asks_no_provider(self):
        assert book(exchange(provider_counts=True)) << PlanFor(None) >> TRIMMED << sending(TRIMMED)

    def test_a_plan_in_reply_is_decided_again_and_a_request_the_provider_says_fits_goes_as_it_came(self):
        assert (
            book(exchange(provider_counts=True))
            << PlanFor(None)
            >> bound(TRIMMED)
            << ProviderCount(bound(TRIMMED))
            >> FITS
            << Send(None, FITS, 1, "unchanged")
        )

    def test_a_rejected_plan_the_provider_says_fits_is_sent(self):
        system = {"role": "system", "content": words(5_000)}
        huge = bound(fit({"model": "gpt-4o", "messages": [system, {"role": "user", "content": "Hi"}]}, 1_000))
        assert book(exchange(provider_counts=True)) << PlanFor(None) >> huge << ProviderCount(huge) >> FITS << Send

    def test_no_answer_keeps_the_cut(self):
        """None: the endpoint failed, was late, or counted over the budget; the cut on the upper bound stands."""
        assert (
            book(exchange(provider_counts=True))
            << PlanFor(None)
            >> bound(TRIMMED)
            << ProviderCount(bound(TRIMMED))
            >> None
            << sending(bound(TRIMMED))
        )

    def test_a_retry_after_an_upstream_overflow_is_not_offered_again(self):
        fits, trimmed = bound(FITS), bound(TRIMMED)
        assert (
            book(exchange(provider_counts=True))
            << PlanFor(None)
            >> fits
            << ProviderCount(fits)
            >> None
            << sending(fits)
            >> overflow(4096, 6100)
            << PlanFor
            >> trimmed
            << sending(trimmed, attempt=2)
        )

    def test_mode_off_plans_nothing_and_asks_nothing(self):
        assert book(exchange("off", provider_counts=True)) << Send(None, None) >> Delivered() << None


class TestBackendRecount:
    def test_within_the_budget_the_backends_exact_count_stands(self):
        budget = TRIMMED.result.budget.input_budget
        assert (
            book(exchange(recounts=True))
            << PlanFor(None)
            >> TRIMMED
            << Recount(TRIMMED.request)
            >> Recounted(budget - 5)
            << Note("estimate", present=False)
            >> None
            << (lambda c: isinstance(c, Send) and c.plan.result.tokens_after == budget - 5)
        )

    def test_an_estimated_count_says_so_after_the_recount(self):
        estimated = replace(TRIMMED, count=replace(TRIMMED.count, exact=False))
        assert (
            book(exchange(recounts=True))
            << PlanFor(None)
            >> estimated
            << Recount
            >> Recounted(10)
            << Note("estimate", present=False)
            >> None
            << Note("estimate")
            >> None
            << Send
        )

    def test_over_the_budget_it_is_re_planned_and_after_the_rounds_sent_with_the_backends_count(self):
        """The last re-plan bounds what the backend has not counted; a count still over the budget
        goes out with the note backend_count_over_budget."""
        over = TRIMMED.result.budget.input_budget + 50
        window = TRIMMED.result.budget.context_window
        played = book(exchange(recounts=True)) << PlanFor(None) >> TRIMMED
        for bound in (False, False, True):
            played = played << Recount >> Recounted(over) << Note("estimate", present=False)
            played = played >> None << PlanFor(window, bound_unfetched=bound) >> TRIMMED
        played = played << Recount >> Recounted(over) << Note("estimate", present=False) >> None
        assert (
            played
            << Note("backend_count_over_budget")
            >> None
            << (lambda c: isinstance(c, Send) and c.plan.result.tokens_after == over)
        )

    def test_a_backend_that_cannot_count_now_leaves_the_plan_as_it_was(self):
        assert book(exchange(recounts=True)) << PlanFor(None) >> FITS << Recount >> None << sending(FITS)


class TestSummaries:
    def test_a_summary_replaces_what_the_cut_dropped(self):
        plan = fit(conversation(30), 3_000, summarize=True)
        chat = conversation(30)
        rendered = {"rendered": True}
        assert (
            book(exchange(chat=chat))
            << PlanFor(None)
            >> plan
            << (lambda c: isinstance(c, Summarise) and c.request.messages[0] == chat["messages"][c.request.indices[0]])
            >> Summary("They asked thirty questions.", "produced")
            << (lambda c: isinstance(c, Render) and c.view.summary.status == "produced" and len(c.view.inserted) == 1)
            >> rendered
            << (lambda c: isinstance(c, Send) and c.body is rendered and c.plan.result.summary.status == "produced")
        )

    def test_without_a_summariser_nothing_is_asked(self):
        plan = fit(conversation(30), 3_000, summarize=True)
        assert book(exchange()) << PlanFor(None) >> plan << sending(plan)

    def test_a_summary_that_failed_leaves_the_cut_as_it_was_and_says_why(self):
        plan = fit(conversation(30), 3_000, summarize=True)
        assert (
            book(exchange(chat=conversation(30)))
            << PlanFor(None)
            >> plan
            << Summarise
            >> Summary(None, "timeout")
            << (lambda c: isinstance(c, Render) and c.view.summary.status == "timeout" and not c.view.inserted)
        )


class TestDecidedFromTheRoute:
    """The window, the tokenizer and the correction are decided by the exchange from what the
    server found; the server only finds the route, asks the backend and looks the correction up."""

    def test_the_route_is_found_first_and_a_correction_looked_up_before_the_first_plan(self):
        routed = Routed(WINDOW, "model_map", chosen=Chosen("model"))
        machine = Exchange("enforce")
        assert Playbook(machine) << FindRoute() >> routed << LookUpCorrection() >> None << PlanFor(None)
        assert (machine.known_window, machine.window_source, machine.recounts) == (WINDOW, "model_map", False)

    def test_a_route_that_cannot_say_how_the_request_is_counted_has_the_tokenizer_chosen(self):
        machine = Exchange("enforce")
        routed = Routed(WINDOW, "backend", provider="vllm", provider_counts=True)
        assert (
            Playbook(machine)
            << FindRoute()
            >> routed
            << ChooseTokenizer()
            >> Chosen("backend", recounts=True)
            << LookUpCorrection()
            >> None
            << PlanFor(None)
        )
        assert machine.recounts and not machine.provider_counts  # the backend's own count needs no provider's

    def test_a_larger_window_opted_into_replaces_the_model_maps_and_a_smaller_one_does_not(self):
        larger, smaller = Exchange("enforce"), Exchange("enforce")
        opted = Routed(200_000, "model_map", opt_in_window=1_000_000, chosen=Chosen("model"))
        assert Playbook(larger) << FindRoute() >> opted << LookUpCorrection() >> None << PlanFor(1_000_000)
        assert (larger.known_window, larger.window_source) == (1_000_000, "opt_in")
        less = Routed(200_000, "model_map", opt_in_window=100_000, chosen=Chosen("model"))
        assert Playbook(smaller) << FindRoute() >> less << LookUpCorrection() >> None << PlanFor(None)
        assert (smaller.known_window, smaller.window_source) == (200_000, "model_map")

    def test_an_opt_in_header_does_not_override_a_window_the_config_or_the_server_states(self):
        machine = Exchange("enforce")
        stated = Routed(32_768, "backend", opt_in_window=1_000_000, chosen=Chosen("model"))
        assert Playbook(machine) << FindRoute() >> stated << LookUpCorrection() >> None << PlanFor(None)
        assert machine.known_window == 32_768

    def test_a_correction_found_applies_its_window_and_is_said_as_the_windows_source(self):
        earlier = exchange()
        assert book(earlier) << PlanFor(None) >> FITS << Send >> overflow(4096, 6100) << PlanFor
        learned = earlier.learned
        assert learned is not None
        machine = Exchange("enforce")
        routed = Routed(WINDOW, "model_map", chosen=Chosen("model"))
        assert Playbook(machine) << FindRoute() >> routed << LookUpCorrection() >> learned << PlanFor(learned.window)
        assert (machine.applied, machine.window_source) == (learned, "correction")

    def test_a_fallback_window_and_a_missing_vocabulary_are_noted(self):
        routed = Routed(8192, "fallback", vocabulary_missing="llama-models", chosen=Chosen("estimate"))
        assert (
            Playbook(Exchange("enforce"))
            << FindRoute()
            >> routed
            << LookUpCorrection()
            >> None
            << Note("fallback_window")
            >> None
            << Note("vocabulary_missing:llama-models")
            >> None
            << PlanFor(None)
        )

    def test_the_provider_a_correction_names_is_the_routes(self):
        """The route says it (its upstream's provider, from what discovery found: proxy.providers);
        None leaves it to the error's own words."""

        def provider(named: str | None) -> str | None:
            machine = Exchange("enforce")
            routed = Routed(WINDOW, "model_map", provider=named)
            assert Playbook(machine) << FindRoute() >> routed << ChooseTokenizer() >> Chosen("model")
            return machine.provider

        assert provider("anthropic") == "anthropic"
        assert provider("llama.cpp") == "llama.cpp"
        assert provider(None) is None

    def test_under_mode_off_the_route_is_still_found_for_the_record_and_the_request_sent_as_it_came(self):
        machine = Exchange("off")
        routed = Routed(WINDOW, "config", chosen=Chosen("model"))
        assert Playbook(machine) << FindRoute() >> routed << LookUpCorrection() >> None << Send(None, None)
        assert machine.window_source == "config"


class TestHeldContext:
    """A request that names context the provider holds: counted as held + sent, the held part never cut."""

    def test_the_held_size_is_looked_up_and_every_plan_counts_it(self):
        machine = exchange(holds=(True, False))
        assert book(machine) << LookUpHeld() >> Held(4_000, "ledger") << PlanFor(None, held=4_000)
        assert machine.held_tokens == 4_000

    def test_a_request_that_names_none_asks_nothing(self):
        assert book(exchange()) << PlanFor(None)

    def test_a_count_of_the_whole_request_gives_the_held_part_as_the_difference(self):
        """OpenAI's input_tokens counts held and sent together: the held part is what the sent one leaves."""
        machine = exchange(holds=(True, False))
        sent = FITS.count.total
        playbook = book(machine) << LookUpHeld() >> Held(None, "provider", whole=sent + 2_500)
        assert playbook << PlanFor(None) >> FITS << PlanFor(None, held=2_500)

    def test_an_unknown_held_size_is_noted_and_the_request_counted_as_sent(self):
        machine = exchange(holds=(True, False))
        playbook = book(machine) << LookUpHeld() >> Held(None, "unknown") << Note("held_unknown") >> None
        assert playbook << PlanFor(None) >> FITS << Send(None, FITS, 1, "unchanged")

    def test_held_context_over_the_budget_is_refused_before_anything_is_sent(self):
        machine = exchange(holds=(True, False))
        rejected = fit(conversation(1), 1_000)
        rejected = replace(rejected, result=replace(rejected.result, outcome="rejected"))
        assert (
            book(machine) << LookUpHeld() >> Held(20_000, "ledger") << PlanFor(None, held=20_000) >> rejected << Reject
        )

    def test_with_truncation_auto_it_is_forwarded_as_it_came_and_noted(self):
        machine = exchange(holds=(True, True))
        rejected = fit(conversation(1), 1_000)
        rejected = replace(rejected, result=replace(rejected.result, outcome="rejected"))
        playbook = book(machine) << LookUpHeld() >> Held(20_000, "ledger") << PlanFor(None, held=20_000) >> rejected
        assert playbook << Note("provider_truncates") >> None << Send(None, rejected, 1, "forwarded_provider_truncates")

    def test_no_provider_count_at_the_edge_with_held_context_counted_in(self):
        """Some count endpoints leave the held part out (Gemini's, of a cache): their count would undercount."""
        machine = exchange(holds=(True, False), provider_counts=True)
        bounded = replace(FITS, count=replace(FITS.count, exact=False))
        playbook = book(machine) << LookUpHeld() >> Held(1_000, "ledger") << PlanFor(None, held=1_000) >> bounded
        assert playbook << Send(None, bounded, 1, "unchanged")

    def test_an_overflow_without_numbers_is_kept_for_the_record(self):
        machine = exchange(self_correct=None)
        error = {
            "error": {
                "message": "Your input exceeds the context window of this model.",
                "code": "context_length_exceeded",
            }
        }
        answered = Answered(400, json.dumps(error).encode(), b"{}")
        assert book(machine) << PlanFor(None) >> FITS << Send >> answered << Relay()
        assert machine.overflow is not None and machine.overflow.prompt_tokens is None
