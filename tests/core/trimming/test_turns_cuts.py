"""Cut positions: quantised, stable when turns are appended, within the history guarantee."""

from __future__ import annotations

import pytest

from proxy.core.trimming.turns import CutPoint, cut_point


class TestCutPoint:
    def test_a_history_that_fits_is_not_cut(self):
        assert cut_point([100, 100], room=500, step=100, droppable=2) == CutPoint(0, 0, 0)

    def test_the_cut_falls_on_the_first_multiple_of_the_step_that_leaves_a_fitting_history(self):
        point = cut_point([300, 300, 300, 300], room=700, step=250, droppable=4)
        assert point == CutPoint(position=500, straddling=1, partial_tokens=100)
        assert 1200 - point.position <= 700 and point.first_whole == 2

    def test_a_position_on_a_turn_boundary_keeps_no_partial_turn(self):
        assert cut_point([250, 250, 250], room=500, step=250, droppable=3) == CutPoint(250, 1, 0)

    def test_appending_turns_keeps_the_cut_until_the_room_is_full_again(self):
        turns = [200] * 10
        cuts = [cut_point(turns[:n], room=1000, step=400, droppable=n) for n in range(6, 11)]
        assert [c.position for c in cuts if c] == [400, 400, 800, 800, 1200]

    def test_a_step_of_one_cuts_no_deeper_than_needed(self):
        point = cut_point([300, 300, 300], room=650, step=1, droppable=3)
        assert point == CutPoint(250, 0, 50)

    def test_a_position_inside_the_oldest_guaranteed_turn_keeps_that_turn_in_part(self):
        assert cut_point([100, 100, 900], room=500, step=100, droppable=2) == CutPoint(600, 2, 500)
        assert cut_point([100, 100, 900], room=900, step=200, droppable=2) == CutPoint(200, 2, 0)

    def test_a_position_past_the_oldest_guaranteed_turn_is_not_a_cut(self):
        assert cut_point([100, 100, 900, 300], room=200, step=100, droppable=2) is None

    def test_a_room_smaller_than_the_step_cuts_the_whole_history(self):
        assert cut_point([100, 100], room=0, step=5000, droppable=2) == CutPoint(200, 2, 0)

    def test_a_step_below_one_is_refused(self):
        with pytest.raises(ValueError, match="step"):
            cut_point([1], room=0, step=0, droppable=1)
