"""Config experiments: deploy a variant, run the engine's own benchmark through the router, keep the
results, pick the next.

    spec.py      the experiment file (YAML) -> :class:`Experiment`, every problem with file:line
    variants.py  named variants and the grid -> roles with their overrides applied, planned
    bench.py     the benchmark client's argv (SGLang's bench_serving, vLLM's bench serve) and its JSON
    store.py     SQLite (stdlib) + the client's raw files, in the results folder
    choose.py    the SLO, the concurrency ladder refined by bisection, when a grid dimension stops paying
    runner.py    the loop: preflight -> deploy (normal gate) -> benchmark, units watched -> record -> teardown
    show.py      the table (and --json); plot.py the PNG with the Pareto front

Only runner.py touches hosts; everything else is pure or local files.
"""
