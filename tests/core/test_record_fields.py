"""`field_dict`: a frozen value's fields as the dict a log line or a store keeps."""

from dataclasses import dataclass

from proxy.core.record_fields import field_dict


@dataclass(frozen=True, slots=True)
class _Point:
    x: int
    y: int
    label: str = "p"


class TestFieldDict:
    def test_fields_go_in_declaration_order_under_their_own_names(self):
        assert list(field_dict(_Point(1, 2)).items()) == [("x", 1), ("y", 2), ("label", "p")]

    def test_a_renamed_field_keeps_its_place_under_the_logged_name(self):
        assert list(field_dict(_Point(1, 2), {"y": "height"})) == ["x", "height", "label"]

    def test_names_choose_the_fields_and_their_order(self):
        assert list(field_dict(_Point(1, 2), names=("label", "x")).items()) == [("label", "p"), ("x", 1)]
