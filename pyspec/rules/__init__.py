"""Pure functions of the decoding rules: the counter-based RNG, the exact acceptance rules, logit processors, JSON schema and its token mask. No I/O, no state."""
