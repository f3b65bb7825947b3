"""The GPU check for a bare CUDA host (``tests/gpu/device_check.sh``).

- :mod:`.bundle`: what such a host lacks (Triton's server tree, the gateway's packages, numpy<2
  for the Python backend, the MiniLM tokenizer), trimmed into one archive that fits the 64 MiB a
  device run may carry; built here, unpacked there.
- :mod:`.models`: model repositories built on the host with random weights of the BERT-large and
  MiniLM shapes.
- :mod:`.check`: the check itself, phase by phase, into one JSON (a dry run skips each GPU phase
  with its reason).

This package imports nothing outside the standard library at module level: ``bundle install``
runs before the bundle's packages are on the path.
"""
