# Kernel families for the determinism policies have no Python API: the plans cimport them (see families.pxd).
