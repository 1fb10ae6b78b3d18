"""Simulators (LIBERO, a fast MuJoCo task) and parallel simulator workers."""
