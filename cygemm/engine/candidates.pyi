# Timing a plan's candidates has no Python API: the plans cimport it (see candidates.pxd).
