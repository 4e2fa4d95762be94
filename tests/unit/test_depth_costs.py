"""Costs at the history's length: every row of a pass attends over the whole history, so a
verify pass and a draft step cost more thousands of tokens into a text."""

from __future__ import annotations

import pytest

from edgespec.engine.device_choice import sane_costs
from edgespec.runtime.k_policy import CostProfile


def test_a_profile_at_depth_adds_each_row_s_attention() -> None:
    shallow = CostProfile(
        target_step_s=0.030,
        draft_step_s=0.010,
        verify_cost=(1.0, 1.1, 1.2),
        target_position_s=1e-6,
        draft_position_s=2e-6,
    )
    assert shallow.at_depth(0) is shallow
    deep = shallow.at_depth(5000)
    assert deep.target_step_s == pytest.approx(0.035)
    assert deep.draft_step_s == pytest.approx(0.020)
    # T(w) at depth = T(w) shallow + w rows x 5 ms, over T(1) at depth.
    expected = (1.0, (0.033 + 0.010) / 0.035, (0.036 + 0.015) / 0.035)
    assert deep.verify_cost == pytest.approx(expected)
    assert deep.c == pytest.approx(0.020 / 0.035)
    flat = CostProfile(target_step_s=0.03, draft_step_s=0.01, verify_cost=(1.0, 1.1))
    assert flat.at_depth(5000) is flat  # nothing measured per position: as measured


def test_kept_costs_read_with_and_without_the_per_position_figures() -> None:
    old = {"target_step_s": 0.03, "draft_step_s": 0.01, "verify_cost": [1.0, 1.2]}
    profile = sane_costs(old)
    assert profile is not None and profile.target_position_s == 0.0
    new = {**old, "target_position_s": 1.5e-6, "draft_position_s": 1.4e-6}
    profile = sane_costs(new)
    assert profile is not None and profile.draft_position_s == 1.4e-6


def test_a_windowed_drafts_step_stops_growing_past_its_window() -> None:
    windowed = CostProfile(
        target_step_s=0.030,
        draft_step_s=0.010,
        verify_cost=(1.0, 1.1),
        target_position_s=1e-6,
        draft_position_s=2e-6,
        draft_window=1152,
    )
    assert windowed.at_depth(1000).draft_step_s == pytest.approx(0.012)
    deep = windowed.at_depth(6000)
    assert deep.draft_step_s == pytest.approx(0.010 + 2e-6 * 1152)  # its window and sink only
    assert deep.target_step_s == pytest.approx(0.036)  # the target reads every position
    assert deep.draft_window == 1152
    kept = sane_costs(
        {
            "target_step_s": 0.03,
            "draft_step_s": 0.01,
            "verify_cost": [1.0, 1.2],
            "draft_window": 1152,
        }
    )
    assert kept is not None and kept.draft_window == 1152
