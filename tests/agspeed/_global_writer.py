"""A module of its own whose functions write its globals (tests/agspeed/test_global_writes.py)."""

calls = 0
last = None


def count_and_double(x):
    global calls, last
    calls += 1
    last = x * 2
    return last + calls
