"""Helpers for tests of the plan layer's tuning (engine/test_candidates, test_families,
test_lt_desc, test_timing): the tuning table isolated in the process, tuning files written as
cygemm writes them, the GPU as the table names it, and cuBLASLt algorithms read as bytes."""
import contextlib
import ctypes
import json

import cygemm
from cygemm.bindings import cuda_paths
from cygemm.engine import tuning

CONFIG_ID, CONFIG_SPLITK_NUM = 0, 2         # cublasLtMatmulAlgoConfigAttributes_t (cublasLt.h)
CONFIG_REDUCTION_SCHEME = 3


@contextlib.contextmanager
def isolated_tuning():
    """The tuning table empty and kept in this process only, no route forced; options, forced
    routes and the table restored after."""
    forced = tuning.forced_routes()
    tuning.force_routes()
    old = cygemm.set_options(tuning_cache=None)
    tuning.clear_tuning()
    try:
        yield
    finally:
        cygemm.set_options(**old)
        tuning.force_routes(**forced)
        tuning.clear_tuning()


def gpu_name(cp):
    """This GPU as the tuning table names it: its name and compute capability."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    return f"{props['name'].decode(errors='replace')} sm_{props['major']}{props['minor']}"


def write_tuning_file(path, gpu, records):
    """A tuning file of this process's versions holding {key: record} of kind "gemm" on `gpu`."""
    lines = [json.dumps(tuning._header())]
    lines += [json.dumps({"gpu": gpu, "kind": "gemm", "key": list(key), "record": record})
              for key, record in records.items()]
    path.write_text("\n".join(lines) + "\n")


def cublaslt():
    return ctypes.CDLL(cuda_paths.LOADED["cublasLt"])


def algo_config(text, attr):
    """An int32 configuration attribute of the cuBLASLt algorithm whose bytes `text` holds in hex
    (read by cuBLASLt itself: cublasLtMatmulAlgoConfigGetAttribute, no GPU work)."""
    raw = bytes.fromhex(text)
    algo = ctypes.create_string_buffer(raw, len(raw))
    value, written = ctypes.c_int32(-1), ctypes.c_size_t(0)
    assert cublaslt().cublasLtMatmulAlgoConfigGetAttribute(algo, attr, ctypes.byref(value), ctypes.sizeof(value),
                                                           ctypes.byref(written)) == 0
    return value.value
