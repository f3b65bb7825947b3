"""The ensembles on a real tritonserver give the in-process reference pipeline's results."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient

from build_models.pipeline import ReferencePipeline
from build_models.profiles import render_repository
from devtools.triton import EmbeddedTriton
from tests.conftest import model_statistics

MIXED_TEXTS = [
    "Great product, works exactly as described.",
    "Terrible. " * 400,  # far beyond the 256-token limit: truncated
    "   ",  # empty after strip: tokenizes to [CLS] [SEP]
    "",
    "Très bien, livré rapidement — 非常好 👍",
    "ok",
]


def infer(
    client: grpcclient.InferenceServerClient, model: str, texts: list[str], output: str
) -> npt.NDArray[np.float32]:
    batch = np.array([[text.encode("utf-8")] for text in texts], dtype=object)
    tensor = grpcclient.InferInput("text", list(batch.shape), "BYTES")
    tensor.set_data_from_numpy(batch)
    result = client.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput(output)])
    array: npt.NDArray[np.float32] | None = result.as_numpy(output)  # both outputs are FP32
    assert array is not None
    return array


@pytest.fixture(scope="module")
def reference(built_repository: Path) -> ReferencePipeline:
    return ReferencePipeline(built_repository)


def test_regression_matches_reference(triton: EmbeddedTriton, reference: ReferencePipeline) -> None:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    scores = infer(client, "text_regression_v1", MIXED_TEXTS, "score")
    assert scores.shape == (len(MIXED_TEXTS), 1) and scores.dtype == np.float32
    expected = reference.score(MIXED_TEXTS)
    np.testing.assert_allclose(scores.reshape(-1), expected, atol=1e-4, rtol=0)
    # The long text was truncated, not rejected, and different texts get different scores.
    assert len(set(np.round(scores.reshape(-1), 4))) > 2


def test_embedding_matches_reference(triton: EmbeddedTriton, reference: ReferencePipeline) -> None:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    embeddings = infer(client, "text_embedding_v1", MIXED_TEXTS, "embedding")
    assert embeddings.shape == (len(MIXED_TEXTS), 384)
    np.testing.assert_allclose(embeddings, reference.embed(MIXED_TEXTS), atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)


def test_padding_is_per_request_and_a_multiple_of_16(reference: ReferencePipeline) -> None:
    ids, mask = reference.tokenize(["short", "a little bit longer than that one"])
    assert ids.shape[1] == 16 and mask.sum(axis=1).tolist() == [3, 9]
    ids, _ = reference.tokenize(["word " * 40])
    assert ids.shape[1] == 48
    ids, _ = reference.tokenize(["word " * 1000])
    assert ids.shape[1] == 256


def test_dynamic_batching_forms_batches_under_concurrency(triton: EmbeddedTriton) -> None:
    before = {m: model_statistics(triton, f"{m}_v1") for m in ("preprocess", "bert", "forest")}
    texts = ["The same short review text."]  # one shape: every request may join a batch

    def one_request(_: int) -> None:
        client = grpcclient.InferenceServerClient(triton.grpc_url)
        infer(client, "text_regression_v1", texts, "score")

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one_request, range(96)))
    after = {m: model_statistics(triton, f"{m}_v1") for m in ("preprocess", "bert", "forest")}
    for model in ("bert", "forest"):
        inferences = after[model]["inference_count"] - before[model]["inference_count"]
        executions = after[model]["execution_count"] - before[model]["execution_count"]
        assert inferences == 96
        assert executions < inferences, f"{model}: no request was batched with another"


def test_every_composing_model_warmed_up_before_ready(triton: EmbeddedTriton) -> None:
    log = triton.log_path.read_text()
    # Triton runs model_warmup while loading; a failed warm-up fails the load (and --exit-on-error).
    for model in ("preprocess_v1", "bert_v1", "forest_v1"):
        assert f"successfully loaded '{model}'" in log
    assert triton.ready_after is not None


def test_dlpack_tensor_path_of_preprocess_runs_in_triton(
    built_repository: Path, tmp_path: Path, reference: ReferencePipeline
) -> None:
    # The GPU path hands tensors on with DLPack; torch_dlpack drives that same code on a CPU instance.
    repository = render_repository(
        tmp_path / "repo",
        "cpu",
        built_repository,
        overrides={"preprocess": {"tensor_library": "torch_dlpack"}},
    )
    with EmbeddedTriton(repository, tmp_path / "work", models=["text_regression_v1"]) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        scores = infer(client, "text_regression_v1", MIXED_TEXTS, "score")
    np.testing.assert_allclose(scores.reshape(-1), reference.score(MIXED_TEXTS), atol=1e-4, rtol=0)
