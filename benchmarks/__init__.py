"""cuvmap's benchmarks: each reports ratios measured side by side in one run."""
