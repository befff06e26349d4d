"""Numeric kernels over interval and record arrays (numpy, numba where it pays)."""
