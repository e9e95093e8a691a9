"""What the tests share besides fixtures: helper modules, the stub engine, and `wait.wait_for`, the one polling loop.

Imported as ``tests.support.<module>`` (setup.cfg puts the checkout's root on pytest's path). Fixtures live in the
conftest.py files; tests/README.md says which.
"""
