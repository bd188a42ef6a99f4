"""The front ends: the command line, the benchmark, and the page worker's session."""
