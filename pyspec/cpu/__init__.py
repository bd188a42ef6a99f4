"""The CPU side: the numpy reference forward (the oracle), the fast row-at-a-time engine, and the CPU executor of the cycle."""
