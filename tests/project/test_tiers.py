"""The quick tier's placement (tests/support/tiers.py): a test that reaches a run or a process through its module's
helpers or fixtures leaves the tier; one that does not stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import tiers


def test_a_run_reached_through_helpers_leaves_the_tier(tmp_path: Path) -> None:
    module = tmp_path / "test_example.py"
    module.write_text(
        "def helper(x):\n    return run_app(x)\n\n"
        "def indirect():\n    return helper(1)\n\n"
        "def test_runs():\n    indirect()\n\n"
        "def test_pure():\n    assert sum([1, 2]) == 3\n\n"
        "def test_process():\n    subprocess.run(['true'])\n\n"
        "class TestLauncher:\n    def test_inside(self):\n        shared_run('x', [])\n")
    assert tiers.runs((module, "test_runs"), set())
    assert not tiers.runs((module, "test_pure"), set())
    assert tiers.runs((module, "test_process"), set())
    assert tiers.runs((module, "TestLauncher"), set())


def test_a_run_reached_through_a_helper_of_another_test_module_leaves_the_tier() -> None:
    """tests/sweeps/test_report.py's tests reach runs through test_sweep.py's rerun_sweep."""
    here = tiers.TESTS / "sweeps" / "test_report.py"
    assert tiers._module(here)[1]["rerun_sweep"] == (tiers.TESTS / "sweeps" / "test_sweep.py", "rerun_sweep")
    assert tiers.runs((tiers.TESTS / "sweeps" / "test_sweep.py", "rerun_sweep"), set())


def test_this_suite_places_unit_tests_in_the_tier_and_runs_outside(request: pytest.FixtureRequest) -> None:
    items = {item.nodeid: item for item in request.session.items}
    unit = "tests/nli/evaluate/test_metrics.py::test_metrics_agree_with_hand_computed_values"
    run = "tests/runs/test_legacy.py::test_an_old_run_folder_evaluates_to_what_its_run_recorded"
    if unit not in items or run not in items:
        pytest.skip("the test files this checks were not collected (a selection by -k, -m or a path)")
    assert items[unit].get_closest_marker("quick") and not items[run].get_closest_marker("quick")
    assert not any(item.get_closest_marker("quick") and item.get_closest_marker("process") for item in items.values())
