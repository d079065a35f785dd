"""The names of the compared methods, shared by the runners and the figures.

The C++ runner (bench/optex_bench/methods.cpp) uses the same names; the
plotting and report tools read them from here without importing optex.
"""

METHODS: tuple[str, ...] = (
    "vanilla",
    "vanilla_nlr",
    "data_parallel",
    "line_search",
    "target",
    "optex_reference",
    "optex_default",
    "optex_adaptive",
    "ablation_last_gradient",
    "ablation_last_point",
)
"""Every method, in the order the runners report them and the figures list them."""
