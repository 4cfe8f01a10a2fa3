"""The dense layer's elementwise passes alone: bias plus activation, and its backward
(``cygemm/dense/elementwise.pyx``)."""
from cygemm.dense.elementwise import act_backward, bias_act

__all__ = ["bias_act", "act_backward"]
