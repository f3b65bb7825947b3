"""Everything the gateway does with Triton; the only package that imports ``tritonclient``.

tritonclient 2.51 requires protobuf<5, whose C extension warns on Python 3.12 while it is first
imported ("Type google._upb._message... uses PyType_Spec with a metaclass that has custom tp_new").
It is imported here once, with that warning silenced, so that running with warnings as errors
(``-W error``, the test suite) cannot turn a third-party deprecation into a failed start.
"""

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", message=r"Type google\._upb\._message\.", category=DeprecationWarning
    )
    import google.protobuf.descriptor  # noqa: F401 - imported for its side effect
