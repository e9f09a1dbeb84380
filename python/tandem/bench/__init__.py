"""Benchmarks (`python -m tandem bench ...`). Timing: CUDA events around each launch, warm-ups first, the
median of several runs; baselines run in the same process and are reported as ratios."""
