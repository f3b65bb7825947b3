"""Development and test tooling, kept out of the runtime ``gateway`` package (and its image).

``devtools.triton`` runs a real ``tritonserver`` from the ``nvidia-pytriton`` wheel on a machine
with no GPU and no Docker; ``devtools.process`` starts child servers that cannot outlive their
parent; ``devtools.ports`` picks free loopback ports. ``python -m gateway dev``, the load tool and
the tests use them.
"""
