"""python -m cygemm info: what a bug report needs, with or without a GPU."""
import os
import subprocess
import sys

import pytest

import cygemm


def test_info_names_versions_libraries_gpus_and_settings():
    env = dict(os.environ, CYGEMM_TUNING_CACHE="/tmp/cygemm-info-test.json", CUPY_TF32="1")
    p = subprocess.run([sys.executable, "-m", "cygemm", "info"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    text = p.stdout
    lt = cygemm.versions()["cublasLt"]
    assert f"cuBLASLt {lt // 10000}.{lt // 100 % 100}.{lt % 100} ({lt})" in text
    libs = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
            for line in text.splitlines() if line.startswith("  lib")}
    for name in ("libcublas", "libcublasLt"):
        assert os.path.isfile(libs[name]), (name, libs)
    reason = cygemm.gpu_unavailable_reason()
    if reason:
        assert f"GPUs: none usable: {reason}" in text
    else:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
        assert f"GPUs: {n}" in text and f"  {n - 1}: " in text
    assert "tuning_cache = '/tmp/cygemm-info-test.json' (CYGEMM_TUNING_CACHE" in text
    assert "autotune = 'auto' (CYGEMM_AUTOTUNE" in text
    assert "follows CUPY_TF32 (now 1)" in text


def test_main_refuses_an_unknown_command():
    p = subprocess.run([sys.executable, "-m", "cygemm", "infos"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "usage: python -m cygemm" in p.stderr and "invalid choice: 'infos'" in p.stderr


def test_help_lists_the_commands():
    p = subprocess.run([sys.executable, "-m", "cygemm", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "check" in p.stdout and "info" in p.stdout


def test_a_malformed_setting_is_a_clear_error_at_first_use_not_at_import():
    code = ("import cygemm\n"
            "try:\n    cygemm.get_options()\nexcept ValueError as e:\n    print('ERR', e)")
    env = dict(os.environ, CYGEMM_AUTOTUNE_MIN_MACS="lots", CYGEMM_TUNING_MODE="warm")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert "ERR CYGEMM_AUTOTUNE_MIN_MACS: expected a number of multiply-adds >= 0, got 'lots'" in p.stdout


def test_help_shows_each_public_signature_once():
    import pydoc
    from cygemm import gemm_ops, graph
    for fn in (cygemm.matmul, cygemm.gemm, cygemm.gemm_strided_batched, gemm_ops.forward_into,
               gemm_ops.backward_into, cygemm.save_tuning, cygemm.load_tuning, graph.capture,
               cygemm.set_options, cygemm.GemmPlan.autotune):
        text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
        name = fn.__name__
        lines = [line.strip() for line in text.splitlines()]
        if not isinstance(fn, type):        # (pydoc shows a class's own line and __init__'s)
            assert sum(line.startswith(f"{name}(") for line in lines) == 1, (name, text[:400])
        for section in ("Parameters", "Returns", "Raises"):
            assert section in (fn.__doc__ or ""), (name, section)


@pytest.mark.nogpu
def test_the_self_check_without_a_gpu_checks_the_modules_and_the_argument_checks():
    """`python -m cygemm` without a GPU imports every module and checks the mapping and an
    argument error on described arrays: it says what it checked, each line ending ok."""
    p = subprocess.run([sys.executable, "-m", "cygemm"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    # The features of the loaded cuBLAS beyond 13.1, one line each, before the GPU's line.
    assert lines[1].startswith("What cuBLASLt ") and lines[1].endswith(" gives beyond 13.1:"), lines[1]
    from cygemm.engine import lt_features
    features = lines[2:2 + len(lt_features.FEATURES)]
    assert all(line.startswith("  ") and (": yes" in line or ": no: " in line) for line in features), features
    assert "grouped GEMMs with the group sizes on the GPU: no: needs a GPU" in features[0]
    assert "no NVIDIA GPU/driver found" in lines[2 + len(lt_features.FEATURES)]
    imported = next(line for line in lines if "modules import" in line)
    n_ok, n_all = (int(x) for x in imported.split()[:3:2])
    assert n_ok == n_all >= 40, imported
    assert sum(line.endswith(" ok") for line in lines) == 2, lines
    assert lines[-1] == "self-check without a GPU passed"


def test_run_from_a_source_tree_that_is_not_built_says_why_and_what_to_do(tmp_path):
    """python -m cygemm in a checkout whose extensions are not built (the installed wheel is
    shadowed by the current folder): an ImportError that says so, not a bare ModuleNotFoundError."""
    import shutil
    import subprocess
    import sys
    src = os.path.join(os.path.dirname(cygemm.__file__))
    if not os.path.isfile(os.path.join(src, "engine", "errors.pyx")):
        pytest.skip("needs the source tree (an installed wheel has no .pyx)")
    shutil.copytree(src, tmp_path / "cygemm", ignore=shutil.ignore_patterns("*.so", "*.c", "*.cpp", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "cygemm"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0
    assert "ImportError: cygemm: imported from the source tree" in done.stderr, done.stderr[-2000:]
    assert "Run from another folder" in done.stderr and "pip install -e ." in done.stderr
