"""This thread's plans: how each GEMM runs, chosen once per problem (``cygemm.engine.plans``);
these are its public calls."""
from cygemm.engine.plans import clear_plan_cache, plan_cache_size

__all__ = ["clear_plan_cache", "plan_cache_size"]
