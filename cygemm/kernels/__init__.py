"""cygemm's CUDA kernels: each ``.cu`` file is compiled once by nvcc at build time and linked into
the modules that launch it; each ``.pxd`` declares its ``extern "C"`` launchers (their headers are
``include/cygemm/*.h``)."""
