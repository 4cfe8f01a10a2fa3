"""The one chooser (cygemm.engine.chooser): the order of every decision, walked over scripted
hooks by ``chooser.walk``. Forced, remembered, the rule without timing run on the CPU; timing
under single flight claims a key on the GPU. The decisions it serves are tested where they are
made: plans in engine/test_plans.py, routes in dense/ and grouped/."""
import pytest

from cygemm.engine import chooser

_keys = iter(range(10**9))


def _key():
    return ("chooser test", next(_keys))        # a key no other decision holds


# ------------------------------------------------------------------ CPU: before timing

@pytest.mark.parametrize("read_table", [False, True])
@pytest.mark.parametrize("may_time", [False, True])
def test_a_forced_choice_decides_before_anything_else(read_table, may_time):
    why, steps = chooser.walk({"forced": [1], "remembered": [1], "time": [1]}, read_table, may_time)
    assert (why, steps) == ("forced", ["forced"])


def test_the_table_is_read_only_when_the_decision_reads_it():
    assert chooser.walk({"remembered": [1]}, True, False) == ("tuned", ["forced", "remembered"])
    # Not read: the rule decides, though the table holds a choice.
    assert chooser.walk({"remembered": [1]}, False, False) == ("rule", ["forced", "rule"])


def test_what_is_not_timed_takes_the_rule_and_says_whether_timing_waits():
    # A problem the size rule does not time: the rule, for good.
    assert chooser.walk({}, False, False) == ("rule", ["forced", "rule"])
    # One whose table was read but may not be timed now: the rule for now.
    assert chooser.walk({}, True, False) == ("untimed", ["forced", "remembered", "rule for now"])


@pytest.mark.parametrize("read_table", [False, True])
def test_a_capturing_stream_is_never_timed(read_table):
    why, steps = chooser.walk({"time": [1]}, read_table, True, capturing=True, key=_key())
    assert "time" not in steps and "flight" not in steps
    assert why == ("untimed" if read_table else "rule")


# ------------------------------------------------------------------ GPU: timed under single flight

@pytest.mark.gpu
def test_a_new_problem_is_timed_under_its_claim_and_the_claim_is_released():
    pytest.importorskip("cupy")
    key = _key()
    assert chooser.walk({"time": [1]}, True, True, key=key) == (
        "timed", ["forced", "remembered", "flight", "time"])
    # Released: the same key is claimed and timed again.
    assert chooser.walk({"time": [1]}, True, True, key=key)[0] == "timed"


@pytest.mark.gpu
def test_timing_that_finds_nothing_takes_the_rule():
    pytest.importorskip("cupy")
    assert chooser.walk({"time": [0]}, True, True, key=_key()) == (
        "rule", ["forced", "remembered", "flight", "time", "rule"])


@pytest.mark.gpu
def test_a_decision_nested_in_the_timing_of_its_own_key_takes_the_rule_for_now():
    """While this thread times a key, a decision of the same key does not wait for itself: it
    asks forced and remembered again, then takes the rule for now."""
    pytest.importorskip("cupy")
    key, nested = _key(), []

    def time_and_nest():
        nested.append(chooser.walk({}, True, True, key=key))
        return True
    assert chooser.walk({"time": [time_and_nest]}, True, True, key=key)[0] == "timed"
    assert nested == [("untimed", ["forced", "remembered", "flight", "forced", "remembered", "rule for now"])]


@pytest.mark.gpu
def test_a_failing_timing_releases_its_claim():
    pytest.importorskip("cupy")
    key = _key()

    def fail():
        raise RuntimeError("timing failed")
    with pytest.raises(RuntimeError, match="timing failed"):
        chooser.walk({"time": [fail]}, True, True, key=key)
    assert chooser.walk({"time": [1]}, True, True, key=key)[0] == "timed"
