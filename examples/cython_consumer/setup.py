"""Build with the cygemm you have installed: pip install --no-build-isolation ."""
import cygemm
from Cython.Build import cythonize
from setuptools import Extension, setup

inc = cygemm.get_include()     # cygemm's .pxd files and headers, the CUDA and cuBLAS headers
setup(ext_modules=cythonize([Extension("consumer", ["consumer.pyx"], include_dirs=inc)],   # for the C compiler
                            include_path=inc))                                             # for cimport
