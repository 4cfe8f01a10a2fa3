# cuBLASLt descriptors have no Python API: the plans cimport them (see _lt_desc.pxd).
