"""Checkout tools (not shipped in the wheel): `python -m tools.generate`."""
