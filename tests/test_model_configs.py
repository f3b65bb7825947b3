"""Both profiles' configs parse as Triton ModelConfigs and the ensembles are wired consistently."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from build_models.profiles import COMPOSING_MODELS, ENSEMBLES, read_config, render_config
from build_models.releases import ReleaseMismatchError, check_treelite, release
from tests.conftest import ROOT

COMMITTED = ROOT / "model_repository"


def configs(profile: str) -> dict[str, mc.ModelConfig]:
    loaded = {
        name: read_config(COMMITTED / name / "config.pbtxt")
        for name in COMPOSING_MODELS + ENSEMBLES
    }
    return {name: render_config(config, profile, dimension=384) for name, config in loaded.items()}


def tensor_specs(config: mc.ModelConfig, kind: str) -> dict[str, tuple[int, tuple[int, ...]]]:
    tensors = config.input if kind == "input" else config.output
    return {t.name: (t.data_type, tuple(t.dims)) for t in tensors}


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_ensemble_wiring_matches_composing_models(profile: str) -> None:
    models = configs(profile)
    for ensemble_name in ENSEMBLES:
        ensemble = models[ensemble_name]
        assert ensemble.platform == "ensemble"
        # Every tensor an ensemble step reads must be an ensemble input or an earlier step's output.
        available = tensor_specs(ensemble, "input")
        for step in ensemble.ensemble_scheduling.step:
            model = models[step.model_name]
            assert model.max_batch_size >= ensemble.max_batch_size
            inputs, outputs = tensor_specs(model, "input"), tensor_specs(model, "output")
            assert set(step.input_map) == set(inputs), f"{step.model_name}: every input must be fed"
            for model_input, ensemble_tensor in step.input_map.items():
                assert ensemble_tensor in available, (
                    f"{ensemble_tensor} is produced by no earlier step"
                )
                assert available[ensemble_tensor] == inputs[model_input], (
                    f"{ensemble_name}: {ensemble_tensor} -> {step.model_name}.{model_input} type/shape mismatch"
                )
            for model_output, ensemble_tensor in step.output_map.items():
                assert model_output in outputs
                available[ensemble_tensor] = outputs[model_output]
        for name, spec in tensor_specs(ensemble, "output").items():
            assert available.get(name) == spec, (
                f"{ensemble_name} output {name} is not produced as declared"
            )


def test_profiles_share_tensor_signatures_and_differ_in_execution() -> None:
    gpu, cpu = configs("gpu"), configs("cpu")
    for name in COMPOSING_MODELS:
        for kind in ("input", "output"):
            assert tensor_specs(gpu[name], kind) == tensor_specs(cpu[name], kind)
        assert all(g.kind == mc.ModelInstanceGroup.KIND_GPU for g in gpu[name].instance_group)
        assert all(g.kind == mc.ModelInstanceGroup.KIND_CPU for g in cpu[name].instance_group)
        assert gpu[name].HasField("dynamic_batching") and cpu[name].HasField("dynamic_batching")
        assert len(gpu[name].model_warmup) >= 1, f"{name} must warm up before taking traffic"
        assert gpu[name].version_policy.HasField("latest")
    assert gpu["bert"].platform == "pytorch_libtorch"
    assert gpu["forest"].backend == "fil"
    assert gpu["forest"].parameters["model_type"].string_value == "treelite_checkpoint"
    assert gpu["forest"].parameters["output_class"].string_value == "false"
    assert gpu["preprocess"].parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "no"
    assert (cpu["bert"].backend, cpu["forest"].backend) == ("python", "python")
    assert not cpu["bert"].platform


def test_rendering_applies_dimension_and_instance_counts() -> None:
    bert = read_config(COMMITTED / "bert" / "config.pbtxt")
    rendered = render_config(bert, "gpu", dimension=1024, instances={"bert": 3})
    assert list(rendered.output[0].dims) == [1024]
    assert [g.count for g in rendered.instance_group] == [3]
    forest = render_config(
        read_config(COMMITTED / "forest" / "config.pbtxt"), "gpu", dimension=1024
    )
    assert list(forest.input[0].dims) == [1024]
    assert [list(w.inputs["input__0"].dims) for w in forest.model_warmup] == [[1024]]


def test_treelite_version_is_checked_against_the_release_table() -> None:
    assert check_treelite("24.10", "4.3.0").server_version == "2.51.0"
    with pytest.raises(ReleaseMismatchError, match="different version of Treelite"):
        check_treelite("24.10", "4.4.1")
    with pytest.raises(ReleaseMismatchError, match="unknown Triton release"):
        release("19.01")
