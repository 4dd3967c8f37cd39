"""The settings' schema: plain data into frozen dataclasses, every mistake named by place and reason."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config.schema import INTERNAL, Bounds, SchemaError, build, carried, convert, plain, reason
from proxy.config.settings import Settings, settings_from_dict
from proxy.core.trimming.strategies import STRATEGIES
from proxy.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Inner:
    port: Annotated[int, Bounds(ge=0, le=65535)] = 8080
    ratio: Annotated[float, Bounds(gt=0, lt=1)] = 0.5
    name: str = field(default="", metadata=INTERNAL)


@dataclass(frozen=True, kw_only=True)
class Outer:
    required: str
    inner: Inner = Inner()
    items: Annotated[tuple[Inner, ...], Bounds(min_length=1)] = (Inner(),)
    mode: Literal["a", "b"] = "a"
    switch: bool = False
    passthrough: Literal["all", "none"] | tuple[str, ...] = ("/v1/",)
    limit: Annotated[int, Bounds(ge=1)] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    label: Annotated[str, Bounds(min_length=1)] = "a"

    def __post_init__(self) -> None:
        if self.required == "cross":
            raise ValueError("a check across fields failed")
        if self.required == "named":
            raise SchemaError("names its own key", ("inner", "port"))


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(SchemaError) as caught:
        build(Outer, data)
    return str(caught.value)


class TestBuilding:
    def test_a_mapping_becomes_the_frozen_dataclass_with_its_defaults(self):
        built = build(Outer, {"required": "x", "inner": {"port": 9000}, "items": [{"ratio": 0.25}]})
        assert built == Outer(required="x", inner=Inner(port=9000), items=(Inner(ratio=0.25),))
        with pytest.raises(dataclasses.FrozenInstanceError):
            built.required = "y"  # type: ignore[misc]

    def test_values_read_as_yaml_and_environment_variables_give_them(self):
        built = build(Outer, {"required": "x", "inner": {"port": "9000", "ratio": "0.1"}, "switch": "yes"})
        assert (built.inner.port, built.inner.ratio, built.switch) == (9000, 0.1, True)
        assert build(Outer, {"required": "x", "inner": {"port": 9000.0}}).inner.port == 9000
        assert build(Outer, {"required": "x", "switch": "off"}).switch is False

    def test_strict_takes_each_value_only_as_its_own_type(self):
        assert convert(int, 5, strict=True) == 5
        assert convert(float, 5, strict=True) == 5.0
        for hint, value in ((int, "5"), (int, 5.0), (int, True), (bool, "yes"), (float, "0.5"), (str, 5)):
            with pytest.raises(SchemaError):
                convert(hint, value, strict=True)

    def test_a_union_takes_the_first_member_that_fits(self):
        assert build(Outer, {"required": "x", "passthrough": "all"}).passthrough == "all"
        assert build(Outer, {"required": "x", "passthrough": ["/v1/", "/v2/"]}).passthrough == ("/v1/", "/v2/")
        assert build(Outer, {"required": "x", "limit": None}).limit is None

    def test_a_value_built_already_is_taken_as_it_is(self):
        inner = Inner(port=1)
        assert build(Outer, {"required": "x", "inner": inner}).inner is inner


class TestErrorsNamePlaceAndReason:
    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ({"required": "x", "inner": {"port": "eighty"}}, "inner.port: must be a whole number, not 'eighty'"),
            ({"required": "x", "inner": {"port": 70000}}, "inner.port: must be at most 65535, not 70000"),
            ({"required": "x", "inner": {"port": 1.5}}, "inner.port: must be a whole number, not 1.5"),
            ({"required": "x", "inner": {"ratio": 0}}, "inner.ratio: must be greater than 0, not 0"),
            ({"required": "x", "inner": {"ratio": "nan"}}, "inner.ratio: must be a number, not 'nan'"),
            ({"required": "x", "inner": {"ratio": 10**400}}, "inner.ratio: must be a number, not 1" + "0" * 76 + "..."),
            ({"required": "x", "inner": {"port": "9" * 5000}}, "inner.port: must be a whole number, not '" + "9" * 76 + "..."),
            ({"required": "x", "inner": {"prot": 1}}, "inner.prot: unknown setting; known here: port, ratio"),
            ({"required": "x", "items": [{}, {"port": -1}]}, "items[1].port: must be at least 0, not -1"),
            ({"required": "x", "items": []}, "items: must hold at least 1 item(s)"),
            ({"required": "x", "label": ""}, "label: must hold at least 1 character(s)"),
            ({"required": "x", "mode": "c"}, "mode: must be one of a, b, not 'c'"),
            ({"required": "x", "switch": "maybe"}, "switch: must be true or false, not 'maybe'"),
            ({"required": "x", "passthrough": "some"}, "passthrough: must be one of all, none, not 'some'"),
            ({"required": "x", "passthrough": ["/v1/", 3]}, "passthrough[1]: must be a string, not 3"),
            ({"required": "x", "limit": 0}, "limit: must be at least 1, not 0"),
            ({"required": "x", "inner": [1]}, "inner: must be a mapping"),
            ({"required": "x", "extra": {1: "a"}}, "extra: must be a string, not 1"),
            ({"inner": {}}, "required: is required"),
            ({"required": "cross"}, "a check across fields failed"),
            ({"required": "named"}, "inner.port: names its own key"),
        ],
    )
    def test_rejects(self, data, message):
        assert error_of(data) == message

    def test_the_reason_alone_for_a_caller_that_names_the_place(self):
        with pytest.raises(SchemaError) as caught:
            build(Outer, {"required": "x", "inner": {"port": 70000}})
        assert reason(caught.value) == "must be at most 65535, not 70000"
        assert reason(ValueError("plain")) == "plain"


class TestPlainData:
    def test_a_dataclass_as_json_ready_data_without_the_fields_the_loader_fills(self):
        built = build(Outer, {"required": "x", "inner": {"name": "filled", "port": 1}})
        data = plain(built)
        assert data["inner"] == {"port": 1, "ratio": 0.5}
        assert data["items"] == [{"port": 8080, "ratio": 0.5}] and data["passthrough"] == ["/v1/"]
        assert build(Outer, data) == dataclasses.replace(built, inner=Inner(port=1))


def test_starting_the_server_imports_no_validation_library():
    code = "import sys, proxy.cli, proxy.server.process.run; print(sorted(m for m in ('pydantic', 'msgspec') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@dataclass(frozen=True)
class _Policy:
    ratio: float = 0.5
    limit: int = 10
    kind: str = "auto"


class TestCarried:
    def test_each_field_comes_from_the_setting_of_its_name_or_its_rename(self):
        section = Outer(required="x", limit=3)
        assert carried(_Policy, section, {"kind": "mode"}) == _Policy(limit=3, kind="a")

    def test_a_field_the_section_has_no_setting_for_keeps_its_default_and_given_wins(self):
        section = Settings()
        assert carried(_Policy, section.budget, {"limit": "output_reserve_min"}, kind="openai") == _Policy(
            0.5, 500, "openai"
        )


class TestAnyYamlIsLoadedOrRefusedClearly:
    """Whatever a YAML file holds, the loader gives settings or one ConfigError naming the key:
    never another exception (a traceback at start is a defect, not an error message)."""

    @staticmethod
    def yaml_like() -> st.SearchStrategy[Any]:
        scalars = st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.integers(-(2**40), 2**40),
            st.builds(pow, st.just(10), st.just(5000)),  # more digits than Python writes out or a float holds
            st.just("9" * 5000),  # digits beyond what Python reads as an integer
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from(["", "yes", "off", "8080", "1.5", "enforce", "*", "/v1/", "http://h:1/v1", "o200k_base"]),
            st.text(max_size=8),
        )
        keys = st.sampled_from(sorted(_SETTING_NAMES)) | st.text(max_size=6)
        return st.recursive(
            scalars,
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
            max_leaves=12,
        )

    @settings(max_examples=150, deadline=None)
    @given(data=st.data())
    def test_loads_or_raises_a_config_error(self, data):
        sections = data.draw(st.dictionaries(st.sampled_from(sorted(_SECTIONS)), self.yaml_like(), max_size=3))
        try:
            settings_from_dict(sections, "cg.yaml", {})
        except ConfigError as exc:
            assert str(exc).startswith("cg.yaml: ")


def _names(hint: Any) -> set[str]:
    """Every field name of the settings' sections, however deep (the keys worth drawing)."""
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint, include_extras=True)
        return {f.name for f in dataclasses.fields(hint)}.union(*(_names(hints[f.name]) for f in dataclasses.fields(hint)))
    return set().union(*(_names(arg) for arg in typing.get_args(hint)))


_SECTIONS = {f.name for f in dataclasses.fields(Settings)} - {"source"}
_SETTING_NAMES = _names(Settings) | set(STRATEGIES)
