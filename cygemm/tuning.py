"""Tuned choices: what autotune timed, kept in this process and in the tuning file, and the
routes a test or a comparison may force. The table itself is the engine's
(``cygemm.engine.tuning``); these are its public calls."""
from cygemm.engine.tuning import (clear_tuning, force_routes, forced_routes, load_tuning, register_routes,
                                  registered_routes, save_tuning, tuning_count, tuning_entries)

__all__ = ["tuning_entries", "tuning_count", "clear_tuning", "save_tuning", "load_tuning", "force_routes",
           "forced_routes", "registered_routes"]
# (register_routes: how a layer above the engine, cygemm.nn's, declares its routes at import)
