"""Locust scenario for teams that already use Locust (Locust is not a dependency of this project).

    LOAD_API_KEY=... locust -f load/locustfile.py --host http://127.0.0.1:8000 \
        --users 16 --spawn-rate 16 --run-time 60s --headless

Environment: ``LOAD_API_KEY`` (the gateway key), ``LOAD_TEXTS_PER_REQUEST`` (default 1),
``LOAD_SEED``. Texts come from the same realistic mix as ``python -m load``. Locust's users are
closed-loop with think time; for honest tail latency use ``python -m load run ... --rate``.
"""

from __future__ import annotations

import itertools
import os

from locust import HttpUser, between, task

from load.workload import TextMix, make_requests

API_KEY = os.environ.get("LOAD_API_KEY", "")
TEXTS_PER_REQUEST = int(os.environ.get("LOAD_TEXTS_PER_REQUEST", "1"))
SEED = int(os.environ.get("LOAD_SEED", "20241010"))
REQUESTS = make_requests(2000, TEXTS_PER_REQUEST, TextMix(seed=SEED))


# Locust is not installed in this project's environment: mypy sees its names as Any.
class PredictUser(HttpUser):  # type: ignore[misc]
    """An app posting texts to ``/v1/predict``."""

    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        """Each user walks the shared request pool from its own offset."""
        self.requests = itertools.cycle(REQUESTS[id(self) % len(REQUESTS) :] + REQUESTS)

    @task  # type: ignore[untyped-decorator]
    def predict(self) -> None:
        """POST one request and check one score per text."""
        texts = next(self.requests)
        with self.client.post(
            "/v1/predict",
            json={"texts": texts},
            headers={"X-API-Key": API_KEY},
            name="/v1/predict",
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
            elif len(response.json().get("scores", [])) != len(texts):
                response.failure("wrong number of scores")
            else:
                response.success()
