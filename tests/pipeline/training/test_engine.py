import pytest
import torch

from pipeline.training.engine import (EngineSettings, deepspeed_config, param_groups, resolve_precision,
                                      warmup_linear_decay)


def settings(**kw):
    base = dict(device=torch.device("cpu"), precision="fp32", world_size=2, zero_stage=2, grad_accum=4,
                grad_clip=2.0, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, warmup_steps=10, total_steps=100)
    base.update(kw)
    return EngineSettings(**base)


def test_deepspeed_config_from_settings():
    cfg = deepspeed_config(settings())
    assert cfg["train_batch_size"] == 8 and cfg["gradient_accumulation_steps"] == 4
    assert cfg["train_micro_batch_size_per_gpu"] == 1  # one token bucket per micro step
    assert cfg["gradient_clipping"] == 2.0 and cfg["zero_optimization"]["stage"] == 2
    assert cfg["bf16"]["enabled"] is False
    assert deepspeed_config(settings(precision="bf16", zero_stage=0))["bf16"]["enabled"] is True
    assert deepspeed_config(settings(zero_stage=0))["zero_optimization"] == {"stage": 0}


def test_precision_defaults_to_fp32_on_cpu_and_bf16_on_gpu():
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("auto", torch.device("cuda", 0)) == "bf16"
    assert resolve_precision("fp32", torch.device("cuda", 0)) == "fp32"


def test_warmup_then_linear_decay():
    f = warmup_linear_decay(4, 12)
    values = [f(k) for k in range(13)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert values[4] == 1.0 and values[8] == pytest.approx(0.5) and values[12] == 0.0
    assert all(a >= b for a, b in zip(values[4:], values[5:]))
    assert warmup_linear_decay(0, 10)(0) == 1.0


def test_no_weight_decay_on_biases_and_norms():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Embedding(5, 4))
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert {tuple(p.shape) for p in decay["params"]} == {(4, 3), (5, 4)}
    assert {tuple(p.shape) for p in no_decay["params"]} == {(4,)}
    assert len(no_decay["params"]) == 3


def test_extra_deepspeed_config_is_merged_over_the_generated_one():
    extra = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}, "flops_profiler": {"enabled": True}}
    cfg = deepspeed_config(settings(extra=extra))
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["zero_optimization"]["contiguous_gradients"] is True
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert cfg["flops_profiler"] == {"enabled": True} and cfg["train_batch_size"] == 8


def test_pretrain_deepspeed_refuses_what_params_own_and_unknown_sections(tmp_path):
    from pipeline.config import ParamsError, load_params

    repo = __import__("pathlib").Path(__file__).resolve().parents[3]
    ok = load_params(repo / "params.yaml", ["pretrain.deepspeed={activation_checkpointing: {partition_activations: true}}"])
    assert ok.pretrain.deepspeed["activation_checkpointing"] == {"partition_activations": True}
    for value, message in (("{gradient_clipping: 1.0}", "set by pretrain.optim.grad_clip"),
                           ("{zero_optimization: {stage: 3}}", "set by pretrain.zero_stage"),
                           ("{flops_profile: {enabled: true}}", "unknown DeepSpeed section 'flops_profile'")):
        with pytest.raises(ParamsError, match=message):
            load_params(repo / "params.yaml", [f"pretrain.deepspeed={value}"])


def test_deepspeed_validates_the_extra_values_when_the_engine_starts():
    from pipeline.training.engine import initialize
    from pipeline.training.launch import process_group

    bad = settings(world_size=1, zero_stage=0, grad_accum=1,
                   extra={"zero_optimization": {"offload_optimizer": {"device": "gpu2"}}})
    with process_group("cpu"), pytest.raises(ValueError, match="(?s)pretrain.deepspeed: DeepSpeed rejects .*offload_optimizer"):
        initialize(torch.nn.Linear(3, 3), bad)
