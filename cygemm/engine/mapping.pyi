# The row-major -> column-major mapping has no Python API: the entry points cimport it (see mapping.pxd).
