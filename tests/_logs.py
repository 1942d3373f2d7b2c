"""Test helper: the messages agspeed's log topics emit while a block runs."""

import contextlib
import logging

import agspeed


@contextlib.contextmanager
def logged(*names):
    """Messages of the agspeed loggers ``names`` while the block runs."""
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect()
    loggers = [logging.getLogger(f"agspeed.{n}") for n in names]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        with agspeed.config.override(log=",".join(names)):
            yield messages
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
