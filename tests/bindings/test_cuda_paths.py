"""CPU: cygemm.bindings.cuda_paths: cuBLAS loaded from where cuda-pathfinder finds it, and
cygemm.get_include()'s folders (or the missing header named, with the remedy)."""
import pytest

import cygemm


def test_get_include_lists_existing_folders_with_pxd_and_headers():
    import os
    dirs = cygemm.get_include()
    assert dirs and all(os.path.isdir(d) for d in dirs)
    for needed in ("cygemm/rowmajor/gemm.pxd", "cygemm/engine/context.pxd", "cygemm/kernels.h", "cublas_v2.h",
                   "cublasLt.h", "cuda_runtime_api.h"):
        assert any(os.path.exists(os.path.join(d, needed)) for d in dirs), needed


def test_get_include_names_missing_cublas_headers_and_the_remedy(monkeypatch):
    from cuda import pathfinder
    from cygemm.bindings import cuda_paths as _cuda_paths
    real = pathfinder.find_nvidia_header_directory
    monkeypatch.setattr(pathfinder, "find_nvidia_header_directory",
                        lambda name: None if name == "cublas" else real(name))
    monkeypatch.setattr(_cuda_paths, "_wheel_dirs", lambda sub: [])
    with pytest.raises(FileNotFoundError) as info:
        cygemm.get_include()
    assert "cublas_v2.h" in str(info.value) and "pip install nvidia-cublas" in str(info.value)


def test_cublas_is_loaded_from_where_cuda_pathfinder_finds_it():
    import ctypes
    import os
    from cygemm.bindings import cuda_paths as _cuda_paths
    loaded = _cuda_paths.load_cublas()
    assert set(loaded) == {"cublas", "cublasLt"}
    for name, path in loaded.items():
        assert os.path.basename(path) == f"lib{name}.so.13" and os.path.isfile(path)
        ctypes.CDLL(path)   # loadable from that path
