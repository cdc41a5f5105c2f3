"""Helpers shared by the test files (plain functions and constants; the fixtures stay in tests/conftest.py).

Imported as `from helpers.<module> import ...`: pytest puts tests/ on sys.path (`pythonpath` in pyproject.toml),
and the subprocesses the tests launch get it on PYTHONPATH when they load a test callback
(`+callbacks.x._target_=helpers.callbacks.SlowSteps`).
"""
