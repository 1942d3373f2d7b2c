"""Test helper: what torch._dynamo makes of a call, as the reference for graph counts."""


def dynamo_graph_count(fn, *args, **kwargs):
    import torch._dynamo

    torch._dynamo.reset()
    try:
        return torch._dynamo.explain(fn)(*args, **kwargs).graph_count
    finally:
        torch._dynamo.reset()
