# The dense layer's routes have no Python API of their own: cygemm.dense cimports them and names FORWARD_ROUTES and BACKWARD_ROUTES.
