import pytest
import torch

from pipeline.training.engine import (EngineSettings, deepspeed_config, param_groups, resolve_precision,
                                      warmup_linear_decay)


def _pretraining_batches():
    """tests/model/test_pretraining.py's vocabulary size, feature width, class count and batch maker."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "model"))
    from test_pretraining import C, D, VOCAB, make_batch

    return VOCAB, D, C, make_batch


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


def test_precision_defaults_to_bf16_on_gpu():  # on the CPU: test_precision_on_cpu_follows_native_bf16
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


def test_head_lr_mul_gives_the_parameters_outside_the_encoder_their_own_rate():
    model = torch.nn.Module()
    model.uniter = torch.nn.Linear(3, 4)  # the encoder (FinetuneModule: model.uniter.*)
    model.head = torch.nn.Linear(4, 2)
    assert len(param_groups(model, 0.01, lr=1e-4)) == 2  # one rate: BERT's two groups, as before
    enc_decay, enc_no_decay, head_decay, head_no_decay = param_groups(model, 0.01, lr=1e-4, head_lr_mul=10.0)
    assert "lr" not in enc_decay and enc_decay["params"] == [model.uniter.weight]
    assert enc_no_decay["params"] == [model.uniter.bias]
    assert head_decay["lr"] == head_no_decay["lr"] == pytest.approx(1e-3)
    assert head_decay["params"] == [model.head.weight] and head_no_decay["params"] == [model.head.bias]
    optimizer = torch.optim.AdamW(param_groups(model, 0.01, lr=1e-4, head_lr_mul=10.0), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(2, 10))
    optimizer.step()
    scheduler.step()  # the same schedule scales both rates
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-4, 1e-4, 1e-3, 1e-3])


def test_extra_deepspeed_config_is_merged_over_the_generated_one():
    extra = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}, "flops_profiler": {"enabled": True}}
    cfg = deepspeed_config(settings(extra=extra))
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["zero_optimization"]["contiguous_gradients"] is True
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert cfg["flops_profiler"] == {"enabled": True} and cfg["train_batch_size"] == 8
    # a bf16 key of the user's joins the engine's own bf16 section, whose `enabled` stays the precision's
    cfg = deepspeed_config(settings(precision="bf16", extra={"bf16": {"check_grad_overflow": False}}))
    assert cfg["bf16"] == {"enabled": True, "check_grad_overflow": False}


def test_pretrain_deepspeed_refuses_what_params_own_and_unknown_sections(tmp_path):
    from pipeline.params.parser import ParamsError, load_params

    repo = __import__("pathlib").Path(__file__).resolve().parents[3]
    ok = load_params(repo / "params.yaml", ["pretrain.deepspeed={activation_checkpointing: {partition_activations: true}}"])
    assert ok.pretrain.deepspeed["activation_checkpointing"] == {"partition_activations": True}
    # bf16's overflow check is the user's (docs/gpu.md measures it); bf16 itself is pretrain.precision's
    ok = load_params(repo / "params.yaml", ["pretrain.deepspeed={bf16: {check_grad_overflow: false}}"])
    assert ok.pretrain.deepspeed == {"bf16": {"check_grad_overflow": False}}
    for value, message in (("{gradient_clipping: 1.0}", "set by pretrain.optim.grad_clip"),
                           ("{zero_optimization: {stage: 3}}", "set by pretrain.zero_stage"),
                           ("{bf16: {enabled: true}}", "bf16.enabled is set by pretrain.precision"),
                           ("{bf16: true}", "bf16 must be a mapping"),
                           ("{fp16: {enabled: true}}", "fp16 is set by pretrain.precision"),
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


def test_precision_on_cpu_follows_native_bf16(monkeypatch):
    import pipeline.training.engine as engine

    cpu = torch.device("cpu")
    for native, expected in ((True, "bf16_autocast"), (False, "fp32")):
        monkeypatch.setattr(engine, "cpu_has_bf16", lambda native=native: native)
        assert engine.resolve_precision("auto", cpu) == expected
        assert engine.resolve_precision("bf16", cpu) == "bf16_autocast" and engine.resolve_precision("fp32", cpu) == "fp32"


# bf16 keeps 8 bits of mantissa; with fp32 accumulation a loss moves by well under 2% (measured on
# this batch on a CPU with AMX: 0.005-0.064%; docs/decisions.md#precision-auto)
AUTOCAST_LOSS_RTOL = 0.02


@pytest.mark.parametrize("task", ["mlm", "mrfr", "mrc_kl", "itm"])
def test_bf16_autocast_losses_match_fp32_on_a_fixed_batch(task):
    """The engine under bf16 autocast: fp32 weights (same state dict), bf16 matmuls, and every
    pretraining loss of a `small`-width model within AUTOCAST_LOSS_RTOL of fp32 on the same batch."""
    import copy

    from model.config import UniterConfig
    from model.pretraining import UniterForPretraining
    from pipeline.training.engine import initialize
    from pipeline.training.launch import process_group

    VOCAB, D, C, make_batch = _pretraining_batches()
    torch.manual_seed(0)
    cfg = UniterConfig.from_preset("small", vocab_size=VOCAB, dropout=0.0, num_layers=2)
    reference = UniterForPretraining(cfg, img_dim=D, num_classes=C, wra_weight=0.1)
    batch = make_batch(seed=1, b=8, lt=24, li=16)
    losses, dtypes = {}, []
    with process_group("cpu"):
        for precision in ("fp32", "bf16_autocast"):
            model = copy.deepcopy(reference)
            engine = initialize(model, settings(world_size=1, zero_stage=0, grad_accum=1, precision=precision))
            hook = engine.module.uniter.encoder.layers[0].attention.qkv.register_forward_hook(
                lambda mod, args, out: dtypes.append(out.dtype))
            with torch.no_grad():
                losses[precision] = float(engine(batch, task).loss)
            hook.remove()
            assert set(engine.module.state_dict()) == set(reference.state_dict())
            assert all(p.dtype == torch.float32 for p in engine.module.parameters())
    assert dtypes == [torch.float32, torch.bfloat16]
    assert losses["bf16_autocast"] == pytest.approx(losses["fp32"], rel=AUTOCAST_LOSS_RTOL), losses


@pytest.mark.parametrize("max_norm", [2.0, 1e3])  # clipped, and not (nothing multiplied)
def test_clipping_gives_deepspeeds_bits(max_norm):
    """The one-rank CPU clipping against DeepSpeed's own ``clip_grad_norm_`` (its fp32 path) on the
    same gradients: the same norm and the same gradients, to the bit; parameters without a gradient
    are skipped by both."""
    from deepspeed.runtime.utils import clip_grad_norm_ as deepspeeds

    from pipeline.training.engine import clip_grad_norm_
    from pipeline.training.launch import process_group

    g = torch.Generator().manual_seed(0)
    shapes = [(300, 64), (64,), (7, 5, 3), (1,), (4096,)]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes] + [torch.nn.Parameter(torch.zeros(3))]
    grads = [torch.randn(s, generator=g) * 10 ** torch.empty(s).uniform_(-3, 1, generator=g) for s in shapes]
    clones = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, c, grad in zip(params, clones, grads):
        p.grad, c.grad = grad.clone(), grad.clone()
    with process_group("cpu"):
        theirs = deepspeeds(clones, max_norm)
    ours = clip_grad_norm_(params, max_norm)
    assert torch.equal(ours.reshape(()), theirs.reshape(())), (ours, theirs)
    assert (float(ours) > max_norm) == (max_norm == 2.0)
    for p, c in zip(params, clones):
        assert torch.equal(p.grad, c.grad)
    assert params[-1].grad is None


def test_the_one_rank_cpu_engine_clips_with_it(monkeypatch):
    import pipeline.training.engine as engine_module
    from pipeline.training.launch import process_group

    calls = []
    real = engine_module.clip_grad_norm_
    monkeypatch.setattr(engine_module, "clip_grad_norm_", lambda params, max_norm: calls.append(max_norm) or
                        real(params, max_norm))
    with process_group("cpu"):
        engine = engine_module.initialize(torch.nn.Linear(3, 1), settings(world_size=1, zero_stage=0, grad_accum=1))
        engine.backward(engine(torch.ones(2, 3)).sum())
        engine.step()
    assert calls == [engine.gradient_clipping()] and calls[0] > 0


def _bf16_zero2_engine():
    """A two-layer pretraining model under DeepSpeed's ZeRO-2 bf16 optimizer (the GPU stages' layout),
    on the CPU's one-rank group, and a batch maker (``poison``: one example's features all NaN, so
    the loss and the gradients are NaN)."""
    from model.config import UniterConfig
    from model.pretraining import UniterForPretraining
    from pipeline.training.engine import cast_batch, initialize

    VOCAB, D, C, make_batch = _pretraining_batches()
    torch.manual_seed(0)
    cfg = UniterConfig.from_preset("tiny", vocab_size=VOCAB, dropout=0.0)
    model = UniterForPretraining(cfg, img_dim=D, num_classes=C, wra_weight=0.1)
    engine = initialize(model, settings(precision="bf16", world_size=1, zero_stage=2, grad_accum=1))

    def batch(step: int, poison: bool = False):
        b = make_batch(seed=step)
        if poison:
            b["img_feat"][0] = float("nan")
        return cast_batch(b, torch.device("cpu"), "bf16")

    return engine, batch


def test_zero_bf16_skips_the_same_steps_without_the_per_gradient_overflow_pass():
    """DeepSpeed's per-gradient inf/NaN pass (ZeRO-1/2, bf16) is dropped because its gradient-norm
    test skips the same steps: against an engine that keeps the pass, the same weights after finite
    steps (to the bit), and a NaN step skipped by both, leaving every weight as it was."""
    from pipeline.training.launch import process_group

    with process_group("cpu"):
        ours, batch = _bf16_zero2_engine()
        theirs, _ = _bf16_zero2_engine()
        del theirs.optimizer.has_overflow  # DeepSpeed's own check, per gradient tensor
        passes = {"ours": [], "theirs": []}
        for name, engine in (("ours", ours), ("theirs", theirs)):
            serial = engine.optimizer.has_overflow_partitioned_grads_serial
            engine.optimizer.has_overflow_partitioned_grads_serial = \
                lambda calls=passes[name], serial=serial: calls.append(1) or serial()

        def run(engine, step, poison=False):
            engine.backward(engine(batch(step, poison), "mrfr").loss)
            engine.step()
            return engine.optimizer.overflow, [p.detach().clone() for p in engine.module.parameters()]

        for step, poison in ((0, False), (1, False), (2, True), (3, False)):
            before = [p.detach().clone() for p in ours.module.parameters()]
            our_overflow, our_weights = run(ours, step, poison)
            their_overflow, their_weights = run(theirs, step, poison)
            assert our_overflow is their_overflow is poison, step
            assert all(torch.equal(a, b) for a, b in zip(our_weights, their_weights)), step
            if poison:
                assert all(torch.equal(a, b) for a, b in zip(before, our_weights))
            else:
                assert not all(torch.equal(a, b) for a, b in zip(before, our_weights))
    assert len(passes["theirs"]) == 4 and not passes["ours"]  # the kept pass ran on every step, ours never
