# The dense layer's shared helpers have no Python API: cygemm.fused cimports them.
