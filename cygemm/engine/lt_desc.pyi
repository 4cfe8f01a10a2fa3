# cuBLASLt descriptors have no Python API: the plans cimport them (see lt_desc.pxd).
