# Timing candidates has no Python API: _candidates and routes cimport it (see _timing.pxd).
