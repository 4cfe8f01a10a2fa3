"""cygemm.engine.settings: options read once from the environment (at first use, never at import),
validated, changed by set_options; python -m cygemm info prints them."""
import os
import subprocess
import sys

import pytest

import cygemm
from cygemm.engine import settings as _settings


def _run(code, **env):
    full = dict(os.environ, **env)
    for k in [k for k, v in env.items() if v is None]:
        full.pop(k)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=full)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_defaults_and_the_user_cache_folder(tmp_path):
    out = _run("import cygemm; print(cygemm.get_options())", XDG_CACHE_HOME=str(tmp_path),
               CYGEMM_TUNING_CACHE=None, CYGEMM_AUTOTUNE=None, CYGEMM_AUTOTUNE_MIN_MACS=None,
               CYGEMM_TUNING_MODE=None, CYGEMM_MAX_STREAM_WORKSPACES=None, CYGEMM_PLAN_CACHE_SIZE=None,
               CYGEMM_BATCH_INVARIANCE=None, CYGEMM_JAX_COMMAND_BUFFERS=None)
    opts = eval(out)
    assert opts == {"autotune": "auto", "autotune_min_macs": 2.0 ** 28, "tuning_mode": "cold", "determinism": "off",
                    "tuning_cache": os.path.join(str(tmp_path), "cygemm", "tuning.jsonl"),
                    "max_stream_workspaces": 8, "plan_cache_size": 256, "batch_invariance": "families",
                    "jax_command_buffers": False}


def test_without_xdg_the_cache_is_under_home(tmp_path):
    out = _run("import cygemm; print(cygemm.get_options()['tuning_cache'])", XDG_CACHE_HOME=None,
               HOME=str(tmp_path), CYGEMM_TUNING_CACHE=None)
    assert out.strip() == os.path.join(str(tmp_path), ".cache", "cygemm", "tuning.jsonl")


@pytest.mark.parametrize("value", ["off", "OFF", "none", "0", ""])
def test_the_tuning_file_can_be_turned_off(value):
    out = _run("import cygemm; print(cygemm.get_options()['tuning_cache'])", CYGEMM_TUNING_CACHE=value)
    assert out.strip() == "None"


def test_environment_values_are_parsed_and_bad_ones_named_at_first_use_only():
    out = _run("import cygemm; print(cygemm.get_options())", CYGEMM_AUTOTUNE="exhaustive",
               CYGEMM_AUTOTUNE_MIN_MACS="1e6", CYGEMM_TUNING_MODE="Sustained", CYGEMM_PLAN_CACHE_SIZE="7",
               CYGEMM_DETERMINISM="Batch_Invariant")
    opts = eval(out)
    assert (opts["autotune"], opts["autotune_min_macs"], opts["tuning_mode"], opts["plan_cache_size"],
            opts["determinism"]) == ("exhaustive", 1e6, "sustained", 7, "batch_invariant")
    code = ("import cygemm\ntry:\n    cygemm.get_options()\nexcept ValueError as e:\n    print(e)")
    for var, value, words in [("CYGEMM_TUNING_MODE", "warm", "'cold', 'hot' or 'sustained'"),
                              ("CYGEMM_AUTOTUNE", "yes", "'off', 'auto' or 'exhaustive'"),
                              ("CYGEMM_MAX_STREAM_WORKSPACES", "0", "an integer >= 1"),
                              ("CYGEMM_PLAN_CACHE_SIZE", "1.5", "an integer >= 1"),
                              ("CYGEMM_DETERMINISM", "always", "'off', 'run_to_run' or 'batch_invariant'")]:
        out = _run(code, **{var: value})
        assert out.startswith(f"{var}: expected {words}, got {value!r}"), (var, out)


def test_set_options_changes_and_returns_what_it_replaced():
    old = cygemm.set_options(autotune="off", plan_cache_size=3)
    try:
        assert cygemm.get_options()["autotune"] == "off" and cygemm.get_options()["plan_cache_size"] == 3
        assert set(old) == {"autotune", "plan_cache_size"}
    finally:
        cygemm.set_options(**old)
    assert cygemm.get_options()["autotune"] == old["autotune"]


def test_set_options_tuning_cache_accepts_paths_and_off(tmp_path):
    old = cygemm.set_options(tuning_cache=tmp_path / "t.jsonl")
    try:
        assert cygemm.get_options()["tuning_cache"] == str(tmp_path / "t.jsonl")
        cygemm.set_options(tuning_cache=None)
        assert cygemm.get_options()["tuning_cache"] is None
        cygemm.set_options(tuning_cache="default")
        assert cygemm.get_options()["tuning_cache"] == _settings.default_tuning_cache()
    finally:
        cygemm.set_options(**old)


def test_a_listener_hears_which_options_changed():
    heard = []
    _settings.on_change(heard.append)
    old = cygemm.set_options(tuning_mode="hot")
    cygemm.set_options(**old)
    assert heard[-2:] == [{"tuning_mode"}, {"tuning_mode"}]


def test_setting_an_option_to_its_value_again_drops_no_cache():
    """A caller that sets an option around every GEMM must not make every plan be made again
    (the caches listen for changes)."""
    heard = []
    _settings.on_change(heard.append)
    mode = cygemm.get_options()["determinism"]
    cygemm.set_options(determinism=mode)
    cygemm.set_options(determinism=mode, tuning_mode=cygemm.get_options()["tuning_mode"])
    assert heard == []
    other = "run_to_run" if mode != "run_to_run" else "off"
    old = cygemm.set_options(determinism=other)
    cygemm.set_options(**old)
    assert heard == [{"determinism"}, {"determinism"}]


def test_determinism_is_validated_by_set_options_naming_it_and_kept():
    old = cygemm.set_options(determinism="RUN_TO_RUN")
    try:
        assert cygemm.get_options()["determinism"] == "run_to_run"
        with pytest.raises(ValueError, match=r"^determinism: expected 'off', 'run_to_run' or 'batch_invariant', got 'yes'"):
            cygemm.set_options(determinism="yes")
        assert cygemm.get_options()["determinism"] == "run_to_run"
    finally:
        cygemm.set_options(**old)


def test_batch_invariance_takes_families_or_cublas_from_set_options_and_the_environment():
    old = cygemm.set_options(batch_invariance="CUBLAS")
    try:
        assert cygemm.get_options()["batch_invariance"] == "cublas"
        with pytest.raises(ValueError, match="batch_invariance: expected 'families' or 'cublas', got 'kernels'"):
            cygemm.set_options(batch_invariance="kernels")
        assert cygemm.get_options()["batch_invariance"] == "cublas"         # a refused value changes nothing
    finally:
        cygemm.set_options(**old)
    out = _run("import cygemm; print(cygemm.get_options()['batch_invariance'])", CYGEMM_BATCH_INVARIANCE="cublas")
    assert out.strip() == "cublas"


def test_jax_command_buffers_takes_a_bool_from_set_options_and_1_or_0_from_the_environment():
    old = cygemm.set_options(jax_command_buffers=True)
    try:
        assert cygemm.get_options()["jax_command_buffers"] is True
        with pytest.raises(ValueError, match=r"jax_command_buffers: expected True or False \(in the environment: 1 or "
                                             r"0, on or off, true or false\), got 2"):
            cygemm.set_options(jax_command_buffers=2)
        assert cygemm.get_options()["jax_command_buffers"] is True
    finally:
        cygemm.set_options(**old)
    assert _run("import cygemm; print(cygemm.get_options()['jax_command_buffers'])",
                CYGEMM_JAX_COMMAND_BUFFERS="1").strip() == "True"
    for word, value in (("off", "False"), ("false", "False"), ("no", "False"), ("true", "True")):
        assert _run("import cygemm; print(cygemm.get_options()['jax_command_buffers'])",
                    CYGEMM_JAX_COMMAND_BUFFERS=word).strip() == value
