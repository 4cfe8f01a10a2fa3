"""cygemm's view of the CUDA libraries: their C headers as Cython sees them (cudart, cublas,
cublaslt .pxd) and where CUDA and cuBLAS are installed (cuda_paths, through cuda-pathfinder)."""
