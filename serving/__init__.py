"""Serving without Python: the C++ host of ``serving/host`` and its build helper."""
