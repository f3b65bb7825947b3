"""Load tool: drive the gateway, Triton and a naive in-process baseline with the same traffic.

Run ``python -m load --help``. Everything it sends goes to 127.0.0.1.
"""
