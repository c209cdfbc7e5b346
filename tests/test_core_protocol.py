"""The mirrors that must repeat every field or hook, bound by tests: every message across the engine core's
process boundary (core/protocol.py) comes back equal with every field set, nested ones included, through
the channel's own encoder and decoders and to_wire/from_wire; ForwardingObserver passes on, and the
core's Recorder carries across, every EngineObserver hook. A field or hook added later without its copy
fails here, since the values and the hooks are found by introspection, not listed."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import itertools
import types
import typing
from typing import Any

import msgspec
import pytest

from attnserve.core import protocol
from attnserve.core.channel import ENCODER
from attnserve.core.observations import Observation, Recorder
from attnserve.core.protocol import INBOUND_DECODER, OUTBOUND_DECODER, Step, from_wire, to_wire
from attnserve.engine.domain import Delta, Draining, Final, GenerationRequest, QueueFull
from attnserve.engine.engine import EngineObserver, ForwardingObserver

NO_DEFAULT = object()
HOOKS = sorted(name for name, _ in inspect.getmembers(EngineObserver, inspect.isfunction) if not name.startswith("_"))
# What the Recorder leaves to the front end, which counts it itself: a submit where it sends one
# (client.py), a finish from the Final among the step's events.
COUNTED_BY_THE_FRONT_END = {"on_submit", "on_finish"}


def fields_of(kind: type) -> list[tuple[str, Any, Any]]:
    """(name, type, default or NO_DEFAULT) of a dataclass's or a msgspec Struct's every field."""
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return [(f.name, hints[f.name], default_of(f)) for f in dataclasses.fields(kind)]
    return [
        (f.name, f.type, NO_DEFAULT if f.default is msgspec.NODEFAULT else f.default)
        for f in msgspec.structs.fields(kind)
    ]


def default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return NO_DEFAULT


def has_fields(kind: Any) -> bool:
    return isinstance(kind, type) and (dataclasses.is_dataclass(kind) or issubclass(kind, msgspec.Struct))


class Unlike:
    """Builds a value of a type whose every field, at every depth, differs from its default, and every
    number and string from every other one built: a field copied into another's place is caught too."""

    def __init__(self) -> None:
        self.counter = itertools.count(2)

    def value(self, kind: Any, default: Any = NO_DEFAULT) -> Any:
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        if origin in (typing.Union, types.UnionType):
            return self.value(next(a for a in args if a is not type(None)))
        if origin is tuple:
            return tuple(self.several(args[0])) if args[-1] is Ellipsis else tuple(self.value(a) for a in args)
        if origin in (list, frozenset):
            return origin(self.several(args[0]))
        if has_fields(kind):
            return kind(**{name: self.value(hint, field_default) for name, hint, field_default in fields_of(kind)})
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return next(member for member in reversed(kind) if member != default)
        if kind is bool:
            return default is not True
        if kind in (int, float, str):
            n = next(self.counter)
            return {int: n, float: n + 0.25, str: f"text {n}"}[kind]
        raise TypeError(f"no value for {kind!r}: teach Unlike.value this type")

    def several(self, kind: Any) -> list[Any]:
        """Two of a kind, or one of each kind of a union (every event and observation of a Step)."""
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            return [self.value(a) for a in typing.get_args(kind) if a is not type(None)]
        return [self.value(kind), self.value(kind)]


def fields_left_at_default(value: Any, path: str = "") -> list[str]:
    """Every field, at any depth of `value`, that equals its default (by its path)."""
    if isinstance(value, (tuple, list, frozenset)):
        return [p for i, item in enumerate(value) for p in fields_left_at_default(item, f"{path}[{i}]")]
    if not has_fields(type(value)):
        return []
    left = []
    for name, _, default in fields_of(type(value)):
        got = getattr(value, name)
        if default is not NO_DEFAULT and got == default:
            left.append(f"{path}.{name}")
        left += fields_left_at_default(got, f"{path}.{name}")
    return left


def messages_of(union: Any) -> list[type]:
    return list(typing.get_args(union))


WIRE_MESSAGES = messages_of(protocol.Inbound) + messages_of(protocol.Outbound)
DOMAIN_EVENTS = [Delta, Final]


def test_every_message_of_the_module_is_in_a_union_the_channel_decodes():
    """A Struct defined in protocol.py but in neither Inbound nor Outbound (nor carried by one) is never tested."""
    carried = set(WIRE_MESSAGES) | set(messages_of(protocol.WireEvent)) | set(messages_of(Observation))
    defined = {v for v in vars(protocol).values() if isinstance(v, type) and issubclass(v, msgspec.Struct)}
    assert {kind.__name__ for kind in defined - carried} == set()


@pytest.mark.parametrize("kind", [GenerationRequest, *DOMAIN_EVENTS, *WIRE_MESSAGES], ids=lambda k: k.__name__)
def test_the_built_value_sets_every_field_unlike_its_default(kind):
    """So that a round trip below that drops a field (or forgets a new one) cannot pass by luck."""
    assert fields_left_at_default(Unlike().value(kind)) == []


@pytest.mark.parametrize("kind", WIRE_MESSAGES, ids=lambda k: k.__name__)
def test_every_message_comes_back_equal_through_the_channels_encoder_and_decoder(kind):
    """Submit with a whole GenerationRequest, Cancel, Abort, Stop, Ready, Failed, and a Step with one
    event and one observation of each kind."""
    message = Unlike().value(kind)
    decoder = INBOUND_DECODER if kind in messages_of(protocol.Inbound) else OUTBOUND_DECODER
    assert decoder.decode(ENCODER.encode(message)) == message


def across(events: list[Any]) -> list[Any]:
    """`events` as the front end gets them: to_wire in a Step, encoded, decoded, from_wire."""
    step = Step([(key, to_wire(event)) for key, event in enumerate(events)], [], len(events))
    got = OUTBOUND_DECODER.decode(ENCODER.encode(step))
    assert [key for key, _ in got.events] == list(range(len(events)))
    return [from_wire(wire) for _, wire in got.events]


@pytest.mark.parametrize("kind", DOMAIN_EVENTS, ids=lambda k: k.__name__)
def test_an_event_comes_back_equal_across_the_boundary_with_every_field_set(kind):
    """Delta and Final (with Usage, Timings and TokenLogprob inside) are copied field by field into their
    wire Structs: a field to_wire or from_wire leaves out comes back as its default, and fails here."""
    event = Unlike().value(kind)
    (got,) = across([event])
    assert got == event, "\n".join(
        f"{name}: sent {getattr(event, name)!r}, got {getattr(got, name)!r}"
        for name, _, _ in fields_of(kind)
        if getattr(got, name) != getattr(event, name)
    )


def test_a_refusal_comes_back_as_itself_and_any_other_error_as_a_runtime_error_naming_its_class():
    got = across([QueueFull("the queue holds 8"), Draining("shutting down"), KeyError("slot 3")])
    assert [(type(e), str(e)) for e in got] == [
        (QueueFull, "the queue holds 8"),
        (Draining, "shutting down"),
        (RuntimeError, "KeyError: 'slot 3'"),
    ]


def arguments(hook: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A hook's call as EngineObserver's signature binds it (positional or by name alike)."""
    bound = inspect.signature(getattr(EngineObserver, hook)).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return {name: value for name, value in bound.arguments.items() if name != "self"}


class CallLog(EngineObserver):
    """Keeps every hook's call, by its name and bound arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []


def logged(hook: str):
    def call(self: CallLog, *args: Any, **kwargs: Any) -> None:
        self.calls.append((hook, arguments(hook, args, kwargs)))

    return call


for _hook in HOOKS:
    setattr(CallLog, _hook, logged(_hook))


def every_hook_called(observer: EngineObserver) -> list[tuple[str, dict[str, Any]]]:
    """Call each hook of `observer` once with every parameter given a value unlike its default."""
    unlike, calls = Unlike(), []
    for hook in HOOKS:
        hints = typing.get_type_hints(getattr(EngineObserver, hook))
        params = list(inspect.signature(getattr(EngineObserver, hook)).parameters.values())[1:]
        args = tuple(unlike.value(hints[p.name]) for p in params)
        getattr(observer, hook)(*args)
        calls.append((hook, arguments(hook, args, {})))
    return calls


def test_the_observer_hooks_are_found():
    assert {"on_submit", "on_step", "on_tokens", "on_finish", "on_prefix_cache", "on_spans_dropped"} <= set(HOOKS)


@pytest.mark.parametrize("mirror", [ForwardingObserver, Recorder], ids=lambda k: k.__name__)
def test_a_mirror_overrides_every_observer_hook(mirror):
    """An inherited hook is EngineObserver's no-op: a new hook would be silently dropped."""
    assert [hook for hook in HOOKS if hook not in vars(mirror)] == []


def test_the_forwarding_observer_passes_every_call_on_with_its_arguments():
    inner = CallLog()
    made = every_hook_called(ForwardingObserver(inner))
    assert inner.calls == made


def test_the_recorder_carries_every_hook_but_the_front_ends_own_across_the_boundary():
    """What the core's engine reports comes out of the front end's `apply`, in a Step, call for call."""
    recorder = Recorder()
    calls = every_hook_called(recorder)
    step = OUTBOUND_DECODER.decode(ENCODER.encode(Step([], recorder.take(), 0)))
    replayed = CallLog()
    for observation in step.observations:
        observation.apply(replayed)
    assert replayed.calls == [(hook, args) for hook, args in calls if hook not in COUNTED_BY_THE_FRONT_END]
