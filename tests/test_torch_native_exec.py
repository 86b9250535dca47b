"""Executable golden tests: small training scripts converted by ampify, then run on CPU.

Each script picks its device itself (`torch.device("cuda" if torch.cuda.is_available() else
"cpu")`), so the converted script must autocast on the CPU here. Proof that mixed precision
really ran: matmul/convolution outputs in the reduced dtype (counted below autocast by a
TorchDispatchMode), GradScaler calls in the expected numbers, finite losses; the unconverted
script under the same runner shows no reduced-precision op at all.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ampify.convert import convert_source  # noqa: E402
from ampify.findings import FileStatus  # noqa: E402
from ampify.options import Options  # noqa: E402
from torch_amp_runner import run_script  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "torch_native" / "exec"
#: scripts that are golden inputs as they stand: run from there rather than kept twice
GOLDEN_INPUTS = {"gan_forward_rebinds_input": "bce_forward_rebinds_input_name", "infogan_sigmoid_head": "bce_sigmoid_head_of_tuple",
                 "step_helper_handed_the_loss": "step_helper_handed_the_loss",
                 "optimizers_compared_in_a_zip": "optimizers_compared_in_a_zip"}


def script_path(name: str) -> Path:
    """fixtures/torch_native/exec/<name>.py, or the golden input fixtures/torch_native/<name>.in.py."""
    own = SCRIPTS / f"{name}.py"
    return own if own.exists() else SCRIPTS.parent / f"{GOLDEN_INPUTS.get(name, name)}.in.py"


REDUCED = {"float16": torch.float16, "bfloat16": torch.bfloat16}

#: per script, GradScaler calls over the whole run (float16): steps, updates, scaled backward
#: calls, checkpoint loads. (unscale_ is not counted: GradScaler.step calls it itself.)
EXPECTED_CALLS = {
    # 3 epochs (2 + 1 after reloading the checkpoint) x 3 batches
    "cnn_classifier": {"step": 9, "update": 9, "scale": 9, "load_state_dict": 1, "state_dict": 2},
    # 2 epochs x 3 batches: D and G steps, three backward calls, one update per iteration
    "gan": {"step": 12, "update": 6, "scale": 18, "load_state_dict": 0},
    # 6 micro-batches, a step every 2
    "grad_accumulation": {"step": 3, "update": 3, "scale": 6, "load_state_dict": 0},
    # 8 train_step() calls, one save (state_dict) and one load of self.scaler
    "trainer_class": {"step": 8, "update": 8, "scale": 8, "load_state_dict": 1, "state_dict": 1},
    # 6 batches: 2 warm-up steps that `continue` (their own update) + 4 full steps
    "warmup_and_grad_clamp": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0},
    # 6 iterations: 6 critic steps, 3 generator steps, one update per iteration (3 before `continue`)
    # 4 iterations; the masked write of target values is cast back to float32
    "dqn_target_values": {"step": 4, "update": 4, "scale": 4, "load_state_dict": 0},
    "critic_every_step_generator_every_other": {"step": 9, "update": 6, "scale": 9, "load_state_dict": 0},
    # 4 learn() calls of an agent whose networks own their optimizers (self.critic.optimizer,
    # self.actor.optimizer): two steps, one update each, the agent's self.scaler
    "agent_with_networks_owning_optimizers": {"step": 8, "update": 4, "scale": 8, "load_state_dict": 0},
    # 4 iterations of optimize_parameters(): G and D steps, three backward() calls in helper
    # methods (backward_G, backward_D_basic twice), one update per iteration
    "gan_helper_methods": {"step": 8, "update": 4, "scale": 12, "load_state_dict": 0},
    # 4 iterations: self.forward() (the generator) runs under autocast too, D and G steps
    "forward_for_its_effect": {"step": 8, "update": 4, "scale": 8, "load_state_dict": 0},
    # 4 iterations of infoGAN: D, G and info steps (BCE fused on the sigmoid head), one update each
    "infogan_sigmoid_head": {"step": 12, "update": 4, "scale": 12, "load_state_dict": 0},
    # 5 batches; loss inside backward(), clipping in a one-line `if`, semicolons: reshaped, then converted
    "compound_statements": {"step": 5, "update": 5, "scale": 5, "load_state_dict": 0},
    # 3 iterations: the critic stepped twice (its loss, then the penalty alone) with an update()
    # after the first, then the generator: 3 steps, 2 updates, 3 backward + 1 penalty scale each
    "critic_stepped_twice": {"step": 9, "update": 6, "scale": 12, "load_state_dict": 0},
    # 3 iterations: critic and generator steps; scale() for both losses and the penalty's outputs
    "wgan_gp": {"step": 6, "update": 3, "scale": 9, "load_state_dict": 0},
    # 3 iterations: D and G steps, three scaled backward calls; the Sigmoid fused into the loss
    "dcgan_bce_sigmoid": {"step": 6, "update": 3, "scale": 9, "load_state_dict": 0},
    # 2 epochs x 3 batches; the scaler created in main() and threaded through train() into
    # train_epoch(); train() saves it with the optimizer after each epoch
    "two_level_threading": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0, "state_dict": 2},
    # 3 iterations: D and G steps; the Sigmoid of a Sequential bound to a variable fused into the loss
    "gan_sequential_variable": {"step": 6, "update": 3, "scale": 6, "load_state_dict": 0},
    # 3 iterations: D and G steps, one update each; D's sigmoid dropped, its log taken in float32
    "gan_log_of_probability_written_out": {"step": 6, "update": 3, "scale": 6, "load_state_dict": 0},
    # 4 training iterations: a critic step each, and at two of them 2 x (actor and temperature
    # steps) in the policy loop; one update after the critic step when the policy does not
    # update, one per policy-loop pass when it does
    "sac_autotune": {"step": 12, "update": 8, "scale": 12, "load_state_dict": 0},
    # 2 rounds x 4 iterations: a D step each, a G step every other one, each with its update; the
    # scaler saved once per round, loaded once (after both optimizers) in the second
    "gan_step_functions": {"step": 12, "update": 12, "scale": 12, "load_state_dict": 1, "state_dict": 2},
    # 2 agents x 3 batches: the shared one steps under a lock after clipping; the other steps the
    # actor at two batches and the critic at every batch; one update per batch after the branches
    "rl_agent_branches": {"step": 8, "update": 6, "scale": 8, "load_state_dict": 0},
    # 4 steps; the step's own sigmoids dropped, BCE computed from logits
    "sigmoid_in_step": {"step": 4, "update": 4, "scale": 4, "load_state_dict": 0},
    # 3 epochs x 2 steps; a scaler after each construction (SGD under an `if`, then ASGD)
    "optimizer_switch": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0},
    # 3 batches, two optimizers stepped after one backward, one update per batch
    "two_optimizers_clipped": {"step": 6, "update": 3, "scale": 3, "load_state_dict": 0},
    # 3 batches; decode()'s torch.sigmoid fused into the loss helper's BCE
    "vae_sigmoid_decoder": {"step": 3, "update": 3, "scale": 3, "load_state_dict": 0},
    # 3 iterations: G and D steps; the Sigmoid of the validity head fused into the loss
    "acgan_two_heads": {"step": 6, "update": 3, "scale": 6, "load_state_dict": 0},
    # 4 batches; masked_fill's -1e9 made the scores' dtype minimum, one row masked everywhere
    "attention_masked_fill": {"step": 4, "update": 4, "scale": 4, "load_state_dict": 0},
    # 3 iterations: G and D steps; the Sigmoid fused, the penalty helper reads torch.sigmoid(D(x))
    # and is scaled: g_loss, d_loss and the penalty's outputs
    "dragan_penalty_helper": {"step": 6, "update": 3, "scale": 9, "load_state_dict": 0},
    # 2 epochs x 3 batches; self.sigmoid no longer applied, the model handed to train() and test()
    "siamese_sigmoid_attribute": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0},
    # 4 iterations (vanilla GAN mode): a generator step at every other one, a discriminator step
    # each, one update per iteration; the discriminator's conditional Sigmoid fused into the loss
    "clustergan_wass_flag": {"step": 6, "update": 4, "scale": 6, "load_state_dict": 0},
    # 4 epochs each: the last of the Sigmoid's applications (or the functional sigmoid) fused
    "logistic_sigmoid_hidden_layers": {"step": 4, "update": 4, "scale": 4, "load_state_dict": 0},
    "logistic_functional_sigmoid": {"step": 4, "update": 4, "scale": 4, "load_state_dict": 0},
    # 2 epochs x 3 batches; decode()'s F.sigmoid fused, `out` reused for a sample and a reconstruction
    "vae_output_name_reused": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0},
    # 4 episodes of 3 steps, an update every second one: one backward per stored step
    "policy_gradient_counted_rollout": {"step": 2, "update": 2, "scale": 12, "load_state_dict": 0},
    # 3 batches: one step each; scale() for the summed loss and the penalty's outputs
    "gail_discriminator": {"step": 3, "update": 3, "scale": 6, "load_state_dict": 0},
    # 2 models x 3 steps through one step function; a scaler created after each optimizer
    "optimizer_built_twice": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0},
    # 2 epochs x 3 training batches; the evaluation epochs pass a DummyOptimizer and a disabled
    # GradScaler, and run no backward
    "evaluation_with_dummy_optimizer": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0},
    # 2 epochs x 3 batches: D and G steps; forward() rebinds its input name to the Sequential's
    # output, `D = D.cuda()` under an `if`, the logged scores alias the outputs
    "gan_forward_rebinds_input": {"step": 12, "update": 6, "scale": 12, "load_state_dict": 0},
    # 3 episodes of 5 actions: the forward passes run in select_action(), one step per episode
    "actor_critic_saved_actions": {"step": 3, "update": 3, "scale": 3, "load_state_dict": 0},
    # 2 iterations: eval_batch() three times under autocast, loss.backward(scaler=scaler) scales
    # self.acc_loss in the script's own SequenceLoss.backward()
    "loss_object_in_script": {"step": 2, "update": 2, "scale": 2, "load_state_dict": 0},
    # 4 iterations: the critic and the actor stepped by take_optimisation_step(), the baseline by
    # optimise(), each handed its loss: 3 steps, 3 updates, 3 scaled losses per iteration
    "step_helper_handed_the_loss": {"step": 12, "update": 12, "scale": 12, "load_state_dict": 0},
    # 3 iterations: two discriminators stepped from a list by index, each with its update; then the
    # generator and encoder from a dict and the mapping network from a namespace, one update
    "optimizers_in_collections": {"step": 15, "update": 9, "scale": 9, "load_state_dict": 0},
    # 4 batches; the clip function picked by getattr(torch.nn.utils, ...) gets its unscale_
    "clip_picked_by_name": {"step": 4, "update": 4, "scale": 4, "load_state_dict": 0},
    # 4 batches x 3 networks, each trained in turn in `for net, opt in zip(nets, optimizers):`
    "optimizers_compared_in_a_zip": {"step": 12, "update": 12, "scale": 12, "load_state_dict": 0},
    # 3 epochs x 3 batches; the WeightEMA named `ema_optimizer` is stepped as it was, not by the scaler
    "ema_of_the_weights": {"step": 9, "update": 9, "scale": 9, "load_state_dict": 0},
    # 2 epochs x 3 training batches; the evaluating calls (None for the optimizer) step nothing
    "train_val_with_none_for_evaluation": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0},
    # 2 epochs x 3 batches, two optimizers per step (the one handed in, the one train() builds), one update
    "optimizer_handed_in_and_one_built_in_the_step_function": {"step": 12, "update": 6, "scale": 6,
                                                               "load_state_dict": 0},
    # 6 iterations (WGAN-GP): a D step each, a G step every other one, one update each; scale() for
    # the real and fake losses, the penalty's outputs and its loss (4 a D step), and the G loss
    "loss_switch_after_a_resolution_bump": {"step": 9, "update": 6, "scale": 27, "load_state_dict": 0,
                                            "state_dict": 0},
    # 2 epochs x 3 training batches (plain, then mixup); the evaluating calls (None) step nothing
    "forward_in_a_branch_before_a_conditional_step": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0},
    # 2 agents x 3 learn() calls: critic, alpha (learned temperature only) and actor steps, one update each
    "loss_in_each_branch_of_an_if_that_trains": {"step": 15, "update": 6, "scale": 15, "load_state_dict": 0},
    # the distillation branch: 2 epochs x 3 batches, a checkpoint (state_dict) after each epoch
    "optimizer_of_each_mode_built_in_its_branch": {"step": 6, "update": 6, "scale": 6, "load_state_dict": 0,
                                                   "state_dict": 2},
}


#: scripts that run inference after training, outside any step (a decoded sample): those
#: matmuls stay float32, as ampify converts training steps only
FLOAT32_INFERENCE_MATMULS = {"vae_sigmoid_decoder": 2, "attention_masked_fill": 2, "dragan_penalty_helper": 6,
                             "siamese_sigmoid_attribute": 18, "logistic_functional_sigmoid": 1,
                             # per epoch: a decoded sample (2 layers) and a reconstruction (5)
                             "vae_output_name_reused": 14,
                             # the rollout's actions, picked under no_grad outside the update (12 x 2 layers)
                             "policy_gradient_counted_rollout": 24,
                             # actions picked in float32 at global steps 1-5 (outside any training step)
                             "sac_autotune": 5}


#: scripts whose first float16 iteration overflows at GradScaler's initial scale (the gradient
#: penalty differentiates the scaled outputs): the scaler skips that step and lowers the scale
FIRST_STEP_OVERFLOWS = {"wgan_gp", "dragan_penalty_helper", "gail_discriminator"}


def _convert(name: str, dtype: str, tmp_path: Path) -> Path:
    source = script_path(name).read_text()
    conversion = convert_source(source, Options(backend="native", dtype=dtype), filename=f"{name}.py")
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    assert not [f for f in conversion.findings if f.severity.value != "info"], conversion.findings
    converted = tmp_path / f"{name}.py"
    converted.write_text(conversion.converted)
    return converted


@pytest.mark.parametrize("name", sorted(EXPECTED_CALLS))
def test_unconverted_script_runs_in_float32_only(name):
    evidence = run_script(str(script_path(name)))
    assert evidence.dtypes[torch.float32] > 0
    assert evidence.dtypes[torch.float16] == 0 and evidence.dtypes[torch.bfloat16] == 0
    assert sum(evidence.scaler_calls.values()) == 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(EXPECTED_CALLS))
def test_converted_script_trains_in_reduced_precision(name, dtype, tmp_path):
    evidence = run_script(str(_convert(name, dtype, tmp_path)))
    reduced = REDUCED[dtype]
    # every matmul and convolution, forward and backward, ran in the reduced dtype
    assert evidence.dtypes[reduced] > 0
    assert evidence.dtypes[torch.float32] == FLOAT32_INFERENCE_MATMULS.get(name, 0), dict(evidence.dtypes)
    losses = evidence.script_globals["LOSSES"]
    if dtype == "float16" and name in FIRST_STEP_OVERFLOWS:
        losses = losses[1:]  # GradScaler's first scale (65536) overflows: that step is skipped, as designed
    assert losses and all(math.isfinite(loss) for loss in losses)
    if dtype == "float16":
        expected = EXPECTED_CALLS[name]
        for method, count in expected.items():
            assert evidence.scaler_calls[method] == count, (method, dict(evidence.scaler_calls))
    else:
        # bfloat16 needs no loss scaling: no GradScaler at all
        assert sum(evidence.scaler_calls.values()) == 0


@pytest.mark.parametrize("name", ["cnn_classifier", "grad_accumulation", "trainer_class", "two_optimizers_clipped",
                                  "step_helper_handed_the_loss", "clip_picked_by_name"])
def test_clipping_sees_unscaled_gradients(name, tmp_path):
    """scaler.unscale_ before clip_grad_norm_: the clipped norms stay the size of fp32 norms,
    not 65536 times larger (the GradScaler's initial scale). With two optimizers each clip gets
    the unscale_ of the optimizer whose parameters it clips."""
    fp32 = run_script(str(script_path(name)))
    fp16 = run_script(str(_convert(name, "float16", tmp_path)))
    assert fp32.clip_norms and len(fp16.clip_norms) == len(fp32.clip_norms)
    for mixed, full in zip(fp16.clip_norms, fp32.clip_norms):
        assert math.isfinite(mixed) and mixed < 10 * full + 1, (fp16.clip_norms, fp32.clip_norms)


def test_hand_made_gradient_clamp_sees_unscaled_gradients(tmp_path):
    """`p.grad.data.clamp_(-1, 1)` between backward() and step(): scaler.unscale_ goes before
    it, so the script reads gradients of fp32 size, not 65536 times larger."""
    fp32 = run_script(str(script_path("warmup_and_grad_clamp")))
    fp16 = run_script(str(_convert("warmup_and_grad_clamp", "float16", tmp_path)))
    full, mixed = fp32.script_globals["GRAD_MAX"], fp16.script_globals["GRAD_MAX"]
    assert full and len(mixed) == len(full)
    # an overflowing first scale gives inf (GradScaler then skips that step): not a scaled value
    finite = [(m, f) for m, f in zip(mixed, full) if math.isfinite(m)]
    assert len(finite) >= len(full) - 1, (mixed, full)
    for m, f in finite:
        assert m < 10 * f + 1, (mixed, full)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_reshaped_step_computes_what_the_fp32_step_computed(dtype, tmp_path):
    """The loss bound to a name, the one-line `if` expanded, the semicolons split: the converted
    step trains the same model as the original, within the reduced dtype's tolerance."""
    fp32 = run_script(str(script_path("compound_statements"))).script_globals["LOSSES"]
    mixed = run_script(str(_convert("compound_statements", dtype, tmp_path))).script_globals["LOSSES"]
    assert len(mixed) == len(fp32) == 5
    for converted, original in zip(mixed, fp32):
        assert converted == pytest.approx(original, rel=2e-2), (mixed, fp32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["wgan_gp", "wgan_gp_solver_method", "gail_discriminator", "r1_penalty_unpacked",
                                  "wgan_gp_through_a_regularizer"])
def test_a_scaled_gradient_penalty_equals_the_fp32_penalty(name, dtype, tmp_path):
    """The penalty of the converted WGAN-GP critic step (gradients of scaler.scale(outputs),
    divided by the scale) equals the fp32 penalty within the reduced dtype's tolerance: the loss
    scale is divided out exactly, not left in (65536x) nor lost to float16 underflow. The penalty
    sits in a module-level helper (wgan_gp), in a method of the trainer (StarGAN's Solver, GAIL's
    Discriminator), or in a helper one call away from the step (GAN_stability's wgan_gp_reg()
    calling compute_grad2())."""
    fp32 = run_script(str(script_path(name))).script_globals["PENALTIES"]
    mixed = run_script(str(_convert(name, dtype, tmp_path))).script_globals["PENALTIES"]
    assert len(mixed) == len(fp32) == 3
    if dtype == "float16":
        # the first iteration overflows at the initial scale of 65536; GradScaler skips that step
        assert not math.isfinite(mixed[0]), mixed
        mixed, fp32 = mixed[1:], fp32[1:]
    for converted, original in zip(mixed, fp32):
        assert converted == pytest.approx(original, rel=5e-2, abs=1e-3), (mixed, fp32)


def test_hand_written_sgd_trains_under_bfloat16_autocast_and_float16_is_refused(tmp_path):
    """No optimizer: float16 is refused (GradScaler needs one to step); bfloat16 puts the forward
    pass under autocast, the hand-written update stays, and the weights follow the fp32 run."""
    source = (script_path("manual_sgd")).read_text()
    refused = convert_source(source, Options(dtype="float16"), filename="manual_sgd.py")
    assert refused.status is FileStatus.UNCONVERTED and [f.code for f in refused.findings] == ["AMP226"]
    fp32 = run_script(str(script_path("manual_sgd")))
    mixed = run_script(str(_convert("manual_sgd", "bfloat16", tmp_path)))
    assert mixed.dtypes[torch.bfloat16] > 0 and mixed.dtypes[torch.float32] == 0, dict(mixed.dtypes)
    full, reduced = fp32.script_globals["LOSSES"], mixed.script_globals["LOSSES"]
    assert len(full) == len(reduced) == 4
    for converted, original in zip(reduced, full):
        assert converted == pytest.approx(original, rel=2e-2), (reduced, full)


def test_bce_after_sigmoid_fused_computes_the_same_fp32_losses_and_probabilities(tmp_path):
    """Before any mixed precision: the fused script (no Sigmoid, BCEWithLogitsLoss, torch.sigmoid
    where D(x) is logged) trains exactly as the original does, to 1e-6."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_logits import fuse_bce_after_sigmoid

    module = cst.parse_module((script_path("dcgan_bce_sigmoid")).read_text())
    fused, fusion = fuse_bce_after_sigmoid(module, ImportMap.from_module(module))
    assert "nn.Sigmoid()" not in fused.code and "BCEWithLogitsLoss()" in fused.code
    assert fused.code.count("torch.sigmoid(output)") == 2 and len(fusion.wrapped) == 2
    script = tmp_path / "fused.py"
    script.write_text(fused.code)
    original = run_script(str(script_path("dcgan_bce_sigmoid"))).script_globals
    same = run_script(str(script)).script_globals
    assert same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-6)
    for (dx, dgz), (odx, odgz) in zip(same["PROBABILITIES"], original["PROBABILITIES"]):
        assert dx == pytest.approx(odx, abs=1e-6) and dgz == pytest.approx(odgz, abs=1e-6)


@pytest.mark.parametrize("name", ["acgan_two_heads", "gan_sequential_variable", "dragan_penalty_helper",
                                  "siamese_sigmoid_attribute", "gan_forward_rebinds_input"])
def test_other_bce_forms_fused_compute_the_same_fp32_losses_and_probabilities(name, tmp_path):
    """A two-headed discriminator, a Sequential bound to a variable: fused, then run in fp32,
    the script computes the original's losses and probabilities to 1e-6."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_logits import fuse_bce_after_sigmoid

    module = cst.parse_module(script_path(name).read_text())
    fused, fusion = fuse_bce_after_sigmoid(module, ImportMap.from_module(module))
    code = fused.code.split('"""', 2)[2]  # after the docstring
    applied = "self.sigmoid(" if name == "siamese_sigmoid_attribute" else "nn.Sigmoid()"
    assert applied not in code and "BCEWithLogitsLoss()" in code and fusion.wrapped
    script = tmp_path / "fused.py"
    script.write_text(fused.code)
    original = run_script(str(script_path(name))).script_globals
    same = run_script(str(script)).script_globals
    assert same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-6)
    assert same["PROBABILITIES"] == pytest.approx(original["PROBABILITIES"], abs=1e-6)


def test_sigmoid_applied_in_the_step_fused_computes_the_same_fp32_losses(tmp_path):
    """LeeJunHyun's segmentation solver: the step's `torch.sigmoid(SR)` (read once more, for its
    shape only) and an inline `torch.sigmoid(edges + 0.1).flatten()` go, the losses take the
    logits; run in fp32, the script computes the original's losses to 1e-6."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_in_step import fuse_sigmoid_in_step

    module = cst.parse_module((script_path("sigmoid_in_step")).read_text())
    fused, fusion = fuse_sigmoid_in_step(module, ImportMap.from_module(module))
    assert "SR_probs = SR\n" in fused.code and "BCEWithLogitsLoss()" in fused.code
    assert "F.binary_cross_entropy_with_logits((edges + 0.1).flatten(), GT.flatten())" in fused.code
    assert fused.code.count("torch.sigmoid(SR).mean()") == 1  # the logged probability keeps its sigmoid
    script = tmp_path / "fused.py"
    script.write_text(fused.code)
    original = run_script(str(script_path("sigmoid_in_step"))).script_globals
    same = run_script(str(script)).script_globals
    assert len(original["LOSSES"]) == 4
    assert same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-6)
    assert same["PROBABILITIES"] == pytest.approx(original["PROBABILITIES"], abs=1e-6)


@pytest.mark.parametrize("step", [
    "probs = torch.sigmoid(out)\n    loss = criterion(probs, y)\n    hits = (probs > 0.5).sum()",  # read elsewhere
    "probs = torch.sigmoid(out)\n    probs = probs * mask\n    loss = criterion(probs, y)",  # bound again
    "probs = torch.sigmoid(out)\n    loss = criterion(probs.clamp(1e-6, 1), y)",  # not a shape operation
    "loss = criterion(out, y)",  # no sigmoid: a model ending in one, elsewhere
])
def test_a_sigmoid_in_the_step_is_not_fused_when_its_probability_is_used_otherwise(step):
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_in_step import fuse_sigmoid_in_step

    code = ("import torch\nimport torch.nn as nn\ncriterion = nn.BCELoss()\n\n\n"
            f"def train_step(out, y, mask):\n    {step}\n    loss.backward()\n")
    module = cst.parse_module(code)
    assert fuse_sigmoid_in_step(module, ImportMap.from_module(module)) is None


@pytest.mark.parametrize("name, dropped, written", [
    # ACGAN/SGAN: only the validity head's Sigmoid goes; the unpacked validity feeds BCEWithLogitsLoss,
    # and the logged mean validity reads torch.sigmoid(real_pred)
    ("acgan_two_heads", "nn.Sigmoid()", ["BCEWithLogitsLoss()", "torch.sigmoid(real_pred).mean()"]),
    # infoGAN: forward() applies F.sigmoid to one column and returns it with two code heads; the
    # sigmoid goes, the head feeds BCEWithLogitsLoss, the logged mean D(x) reads torch.sigmoid(D_real),
    # and `_, D_cont, D_disc = self.D(G_)` (the head discarded) stays
    ("infogan_sigmoid_head", "F.sigmoid(x",
     ["a = x[:, self.output_dim]", "BCEWithLogitsLoss()", "torch.sigmoid(D_real).mean()"]),
])
def test_a_sigmoid_head_of_a_tuple_fused_computes_the_same_fp32_losses_and_probabilities(name, dropped, written,
                                                                                         tmp_path):
    """A discriminator with several heads, one of them a sigmoid's: fused, the script computes what
    the original computed, to 1e-6 in fp32."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_logits import fuse_bce_after_sigmoid

    module = cst.parse_module((script_path(name)).read_text())
    fused, fusion = fuse_bce_after_sigmoid(module, ImportMap.from_module(module))
    assert dropped not in fused.code and all(text in fused.code for text in written), fused.code
    assert len(fusion.wrapped) == 1
    script = tmp_path / "fused.py"
    script.write_text(fused.code)
    original = run_script(str(script_path(name))).script_globals
    same = run_script(str(script)).script_globals
    assert same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-6)
    assert same["PROBABILITIES"] == pytest.approx(original["PROBABILITIES"], abs=1e-6)


def test_vae_sigmoid_decoder_fused_computes_the_same_fp32_losses_and_probabilities(tmp_path):
    """The functional form: decode()'s torch.sigmoid goes, the helper's F.binary_cross_entropy
    takes logits, the recorded reconstruction and the decoded sample read torch.sigmoid(...).
    Before any mixed precision the fused script computes what the original computed, to 1e-6."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_functional import fuse_functional_bce

    module = cst.parse_module((script_path("vae_sigmoid_decoder")).read_text())
    fused, fusion = fuse_functional_bce(module, ImportMap.from_module(module))
    assert "return self.fc4(h3)" in fused.code and "F.binary_cross_entropy_with_logits(recon_x" in fused.code
    assert "torch.sigmoid(recon_batch).mean()" in fused.code and "torch.sigmoid(model.decode(" in fused.code
    assert len(fusion.wrapped) == 2
    script = tmp_path / "fused.py"
    script.write_text(fused.code)
    original = run_script(str(script_path("vae_sigmoid_decoder"))).script_globals
    same = run_script(str(script)).script_globals
    assert same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-4)
    assert same["PROBABILITIES"] == pytest.approx(original["PROBABILITIES"], abs=1e-6)


@pytest.mark.parametrize("wass", ["0", "1"])
def test_conditional_sigmoid_fused_computes_the_same_fp32_losses_in_both_modes(wass, tmp_path, monkeypatch):
    """ClusterGAN: the discriminator adds its Sigmoid only when the module-level flag says it is
    not a Wasserstein critic. Fused (the Sigmoid dropped, BCEWithLogitsLoss, the Wasserstein
    branch left reading the raw output), the script computes the original's losses and penalties
    to 1e-6 in both modes; converted, it trains in the reduced dtype in both."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_logits import fuse_bce_after_sigmoid

    monkeypatch.setenv("CLUSTERGAN_WASS", wass)
    name = "clustergan_wass_flag"
    module = cst.parse_module(script_path(name).read_text())
    fused, fusion = fuse_bce_after_sigmoid(module, ImportMap.from_module(module))
    assert "self.model = nn.Sequential(self.model)\n" in fused.code and "BCEWithLogitsLoss()" in fused.code
    assert "g_loss = torch.mean(D_gen)" in fused.code and "torch.sigmoid(" not in fused.code
    assert fused.code.count("nn.Sigmoid()") == 1 and not fusion.wrapped  # the generator keeps its own
    original, same = _original_and_fused_globals(name, fused.code, tmp_path)
    assert len(same["LOSSES"]) == 4 and same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-6)
    assert same["PENALTIES"] == pytest.approx(original["PENALTIES"], abs=1e-6)
    assert bool(original["PENALTIES"]) == (wass == "1")
    for dtype in ("float16", "bfloat16"):
        evidence = run_script(str(_convert(name, dtype, tmp_path)))
        assert evidence.dtypes[REDUCED[dtype]] > 0 and evidence.dtypes[torch.float32] == 0, dict(evidence.dtypes)
        losses = evidence.script_globals["LOSSES"]
        if dtype == "float16" and wass == "1":
            losses = losses[1:]  # the penalty overflows at GradScaler's first scale: that step is skipped
        assert len(losses) >= 3 and all(math.isfinite(loss) for loss in losses), losses


@pytest.mark.parametrize("name", ["logistic_sigmoid_hidden_layers", "logistic_functional_sigmoid"])
def test_last_sigmoid_of_forward_fused_computes_the_same_fp32_losses_and_probabilities(name, tmp_path):
    """The Sigmoid attribute also applied to hidden layers (only its last application goes), or a
    functional sigmoid ending forward() with an nn.BCELoss criterion (the file gets `import torch`
    for the torch.sigmoid(...) reads): fused, in fp32, the original's losses and probabilities to 1e-6."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_logits import fuse_bce_after_sigmoid

    module = cst.parse_module(script_path(name).read_text())
    fused, fusion = fuse_bce_after_sigmoid(module, ImportMap.from_module(module))
    assert "BCEWithLogitsLoss(" in fused.code and fusion.wrapped
    if name == "logistic_sigmoid_hidden_layers":
        assert fused.code.count("self.sigmoid(") == 2 and "y_pred = self.l3(out2)" in fused.code
    else:
        assert "y_pred = self.linear(x)" in fused.code and fused.code.count("\nimport torch\n") == 1
    original, same = _original_and_fused_globals(name, fused.code, tmp_path)
    assert len(same["LOSSES"]) == 4 and same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-6)
    assert same["PROBABILITIES"] == pytest.approx(original["PROBABILITIES"], abs=1e-6)


def test_output_name_reused_for_another_value_is_wrapped_where_it_holds_the_model_output(tmp_path):
    """`out = model.decode(z)` (wrapped where decode() is called), then `out, _, _ = model(x)`: each
    read of `out` sees the assignment before it in the block, and only the reconstruction's reads
    get torch.sigmoid(...). Fused, in fp32, the original's losses and logged means to 1e-6."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_functional import fuse_functional_bce

    name = "vae_output_name_reused"
    module = cst.parse_module(script_path(name).read_text())
    fused, fusion = fuse_functional_bce(module, ImportMap.from_module(module))
    assert "out = torch.sigmoid(model.decode(z)).view(-1, 4, 4)" in fused.code
    assert "torch.sigmoid(out).view(-1, 4, 4)" in fused.code and "PROBABILITIES.append(out.mean().item())" in fused.code
    assert len(fusion.wrapped) == 2
    original, same = _original_and_fused_globals(name, fused.code, tmp_path)
    assert len(same["LOSSES"]) == 6 and same["LOSSES"] == pytest.approx(original["LOSSES"], rel=1e-6, abs=1e-4)
    assert same["PROBABILITIES"] == pytest.approx(original["PROBABILITIES"], abs=1e-6)


def _original_and_fused_globals(name: str, fused_code: str, tmp_path) -> tuple:
    """The globals of the fixture script and of its fused form, each run in float32."""
    script = tmp_path / "fused.py"
    script.write_text(fused_code)
    return run_script(str(script_path(name))).script_globals, run_script(str(script)).script_globals


def test_trainer_class_attributes_fused_compute_the_same_fp32_losses_and_the_conversion_runs(tmp_path):
    """The model and the criterion as attributes of a trainer class (`self.D`, `self.BCE_loss`
    assigned in both branches of `if self.gpu_mode:`), the discriminator's forward() rebinding `x`
    through its layers: fused, in fp32, the original's losses and logged D(x) to 1e-6; converted,
    the script runs (under CUDA autocast where a GPU is present: its device comes from the
    script's own .cuda() calls, so on a CPU it stays float32)."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_logits import fuse_bce_after_sigmoid

    name = "gan_trainer_class_attributes"
    module = cst.parse_module(script_path(name).read_text())
    fused, fusion = fuse_bce_after_sigmoid(module, ImportMap.from_module(module))
    assert fused.code.count("nn.BCEWithLogitsLoss()") == 2 and "nn.Sigmoid()" not in fused.code
    assert "PROBABILITIES.append(torch.sigmoid(D_real).mean().item())" in fused.code and fusion.wrapped
    original, same = _original_and_fused_globals(name, fused.code, tmp_path)
    assert len(same["LOSSES"]) == 6 and same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-6)
    assert same["PROBABILITIES"] == pytest.approx(original["PROBABILITIES"], abs=1e-6)
    evidence = run_script(str(_convert(name, "float16", tmp_path)))
    losses = evidence.script_globals["LOSSES"]
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses), losses
    assert evidence.scaler_calls["update"] == 6 and evidence.scaler_calls["step"] == 12
    if torch.cuda.is_available():
        assert evidence.dtypes[torch.float16] > 0, dict(evidence.dtypes)


def test_evaluation_with_a_dummy_optimizer_gets_a_disabled_scaler_and_changes_nothing(tmp_path):
    """run_epoch(..., DummyOptimizer(), mode="eval") of the Annotated Transformer: the converted call
    passes GradScaler(enabled=False); the evaluation epochs run under autocast, leave the
    parameters as they were, and give finite losses."""
    converted = _convert("evaluation_with_dummy_optimizer", "float16", tmp_path)
    assert "scaler=torch.amp.GradScaler(enabled=False)" in converted.read_text()
    evidence = run_script(str(converted))
    script = evidence.script_globals
    assert len(script["EVAL_LOSSES"]) == 6 and all(math.isfinite(loss) for loss in script["EVAL_LOSSES"])
    for before, after in zip(script["PARAMETERS_BEFORE_EVAL"], script["PARAMETERS_AFTER_EVAL"]):
        assert all(torch.equal(b, a) for b, a in zip(before, after))
    # training moved the parameters between the two evaluations
    first, second = script["PARAMETERS_BEFORE_EVAL"]
    assert not all(torch.equal(a, b) for a, b in zip(first, second))


STANDINS = SCRIPTS.parent / "exec_standins"
WARPCTC_SCRIPT = SCRIPTS.parent / "warpctc_loss_float32_only.in.py"


def _run_with_standins(path: Path, *args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=300,
                          cwd=path.parent, env={"PYTHONPATH": str(STANDINS), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("flags", [["--baidu_ctc"], []])
def test_warpctc_loss_gets_float32_activations_under_autocast(flags, tmp_path):
    """warpctc_pytorch.CTCLoss (a stand-in that raises on non-float32 activations, as the real
    kernel does): the converted script casts its activations and trains under float16 autocast;
    without the cast the same conversion fails."""
    source = WARPCTC_SCRIPT.read_text().replace("range(100)", "range(3)")
    original = tmp_path / "original.py"
    original.write_text(source)
    fp32 = _run_with_standins(original, *flags)
    assert fp32.returncode == 0, fp32.stderr[-2000:]

    conversion = convert_source(source, Options(backend="native", dtype="float16"), filename="train.py")
    # converted; incomplete until the user has checked that the installed build's backward() passes
    # the loss scale on (AMP243)
    assert conversion.status is FileStatus.CHANGED_INCOMPLETE, conversion.reason
    assert [f.code for f in conversion.findings if f.severity.value == "warning"] == ["AMP243"]
    converted = tmp_path / "converted.py"
    converted.write_text(conversion.converted.replace("device_type=device.type", 'device_type="cpu"'))
    run = _run_with_standins(converted, *flags)
    assert run.returncode == 0, run.stderr[-2000:]

    uncast = tmp_path / "uncast.py"
    uncast.write_text(converted.read_text().replace(".float(), text", ", text"))
    failed = _run_with_standins(uncast, *flags)
    if flags:
        assert failed.returncode != 0 and "warp-ctc takes float32 only" in failed.stderr
    else:
        assert failed.returncode == 0, failed.stderr[-2000:]  # torch's CTCLoss runs in float32 under autocast


def test_a_gram_matrix_overflows_float16_under_autocast_and_fits_bfloat16():
    """The premise of AMP238: a style-transfer Gram matrix of a 128x128 feature map sums 16384
    products; under float16 autocast it is inf (the loss too: every step would be skipped), under
    bfloat16 autocast and in float32 it is finite."""
    torch.manual_seed(0)
    features = torch.rand(8, 128 * 128) * 6  # ReLU activations of a few units
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        half = torch.mm(features, features.t())
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        wide = torch.mm(features, features.t())
    assert half.dtype == torch.float16 and torch.isinf(half).all()
    assert wide.dtype == torch.bfloat16 and torch.isfinite(wide).all()
    assert torch.isfinite(torch.mm(features, features.t())).all()


@pytest.mark.parametrize("code, flagged", [
    ("f = x.view(c, h * w)\n    g = torch.mm(f, f.t())", True),
    ("features = x.view(a * b, c * d)\n    g = features.mm(features.t())", True),
    ("f = x.view(b, c, h * w)\n    g = f.bmm(f.transpose(1, 2))", True),
    # EBGAN's pull-away term: cosine similarities of normalized embeddings, within [-1, 1]
    ("e = x.view(x.size(0), -1)\n    n = e / e.norm(dim=1, keepdim=True)\n    g = torch.matmul(n, n.transpose(1, 0))", False),
    # attention: two different operands
    ("q = x.view(c, h * w)\n    g = torch.bmm(q, k.transpose(1, 2))", False),
])
def test_a_gram_matrix_is_told_from_other_self_products(code, flagged):
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.training_loop import HazardKind, analyze_training

    module = cst.parse_module(f"import torch\n\n\ndef style_loss(x, k, a, b, c, d, h, w):\n    {code}\n    return g\n")
    structure = analyze_training(module, ImportMap.from_module(module))
    assert any(h.kind is HazardKind.GRAM_MATRIX for h in structure.hazards) is flagged


def test_the_log_of_a_sigmoid_probability_is_minus_inf_under_float16_autocast():
    """The premise of AMP229: a discriminator ending in nn.Sigmoid, confident (a logit of 9). Under
    float16 autocast its output rounds to 1, `1 - D_fake + 1e-8` is 0 and the log -inf (the loss inf:
    GradScaler would skip every step); under bfloat16 the log is that of the epsilon, far from float32's
    value; in float32 it is about -9; an epsilon of 1e-3 keeps the float16 log finite."""
    D = torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Sigmoid())
    with torch.no_grad():
        D[0].weight.fill_(0.0)
        D[0].bias.fill_(9.0)
    x = torch.ones(2, 4)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        half = torch.log(1 - D(x) + 1e-8)
        half_safe = torch.log(1 - D(x) + 1e-3)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        brain = torch.log(1 - D(x) + 1e-8)
    full = torch.log(1 - D(x) + 1e-8)
    assert torch.isinf(half).all()
    assert torch.isfinite(half_safe).all()
    assert (brain < -18).all() and (full > -9.5).all() and (full < -8.5).all()


@pytest.fixture
def horovod_stand_in(monkeypatch):
    """horovod.torch on one rank (exec_standins/horovod), importable for the test only."""
    monkeypatch.syspath_prepend(str(STANDINS))
    yield
    for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
        del sys.modules[name]


def test_horovod_step_follows_horovods_recipe_and_the_plain_conversion_diverges(horovod_stand_in, tmp_path):
    """hvd.DistributedOptimizer averages the gradients asynchronously, in place, until its step().
    Converted, the step waits (optimizer.synchronize()) before the scaler unscales for the
    clipping, and steps under optimizer.skip_synchronize(): it trains like the fp32 script. The
    plain conversion ampify wrote before (scaler.step(optimizer) alone) unscales first; the
    allreduce then writes the scaled gradients back and the SGD step takes them 65536 times too
    large: the losses blow up."""
    fp32 = run_script(str(script_path("horovod_step")))
    converted = _convert("horovod_step", "float16", tmp_path)
    text = converted.read_text()
    recipe = ("        optimizer.synchronize()\n        scaler.unscale_(optimizer)\n"
              "        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)\n"
              "        with optimizer.skip_synchronize():\n            scaler.step(optimizer)\n        scaler.update()\n")
    assert recipe in text
    fp16 = run_script(str(converted))
    optimizer = fp16.script_globals["optimizer"]
    assert optimizer.synchronize_calls == 12 and fp16.scaler_calls["step"] == 12
    assert fp16.dtypes[torch.float16] > 0
    assert all(math.isfinite(loss) for loss in fp16.script_globals["LOSSES"])
    full, mixed = fp32.script_globals["LOSSES"], fp16.script_globals["LOSSES"]
    assert full[-1] < 0.7 * full[0] and abs(mixed[-1] - full[-1]) < 0.05 + 0.1 * full[-1], (full, mixed)
    plain = tmp_path / "plain_conversion.py"
    plain.write_text(text.replace(recipe, "        scaler.unscale_(optimizer)\n"
                                          "        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)\n"
                                          "        scaler.step(optimizer)\n        scaler.update()\n"))
    raced = run_script(str(plain)).script_globals["LOSSES"]
    assert not all(math.isfinite(loss) and loss < 10 * full[0] for loss in raced), raced


def test_premise_gradients_one_optimizer_unscaled_are_unscaled_again_by_another():
    """Why two optimizers over one model with no zero_grad between their steps are refused
    (infoGAN's info optimizer over G and D, fixtures/torch_native/bce_sigmoid_head_info_not_zeroed):
    a GradScaler unscales per optimizer, in place, so the second step's unscale divides what the
    first backward left (already unscaled) by the scale again. The fp32 step takes g1 + g2; the
    scaled one takes g1 / 1024 + g2."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    steps = {}
    for scaled in (False, True):
        model = torch.nn.Linear(4, 1)
        model.load_state_dict({"weight": torch.ones(1, 4), "bias": torch.zeros(1)})
        first = torch.optim.SGD(model.parameters(), lr=0.0)
        second = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=scaled)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(first)
        scaler.scale((model(x) ** 2).mean()).backward()
        scaler.step(second)
        scaler.update()
        steps[scaled] = model.weight.detach().clone() - torch.ones(1, 4)
    assert not torch.allclose(steps[True], steps[False], atol=1e-3), steps


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["maml_first_order", "fgsm_adversarial"])
def test_gradients_a_step_takes_with_autograd_grad_are_scaled_and_equal_the_fp32_ones(name, dtype, tmp_path):
    """A training step's own `torch.autograd.grad(loss, ...)` (a MAML inner loop's parameter
    gradients, FGSM's input gradient) differentiates scaler.scale(loss) and is divided by the scale
    with float16 (AMP230; before, it ran under autocast unscaled, where float16 gradients underflow):
    the gradients the step uses equal the fp32 ones within the reduced dtype's tolerance, and the
    converted step trains."""
    converted = _convert(name, dtype, tmp_path)
    text = converted.read_text()
    if dtype == "float16":
        assert "torch.autograd.grad(scaler.scale(" in text and "/ scaler.get_scale()" in text, text
    else:
        assert "scaler" not in text, text
    fp32 = run_script(str(script_path(name))).script_globals
    mixed = run_script(str(converted)).script_globals
    assert len(mixed["INNER_NORMS"]) == len(fp32["INNER_NORMS"]) == 4
    finite = [(m, f) for m, f in zip(mixed["INNER_NORMS"], fp32["INNER_NORMS"]) if math.isfinite(m)]
    assert len(finite) >= 3, mixed["INNER_NORMS"]
    for converted_norm, original in finite:
        assert converted_norm == pytest.approx(original, rel=5e-2), (mixed["INNER_NORMS"], fp32["INNER_NORMS"])
    assert all(math.isfinite(loss) for loss in mixed["LOSSES"][1:]), mixed["LOSSES"]


def test_optimizers_stepped_in_a_loop_each_step_once_per_update_on_cpu():
    """`for optimizer in optimizers: optimizer.step()` converted: scaler.step() for each optimizer in
    the loop, scaler.update() once after it. Run on CPU (float16 autocast, GradScaler("cpu")): both
    optimizers step every iteration (no "step() has already been called since the last update()"), and
    the parameters move as the float32 run's do."""
    import torch

    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "torch_native" / "optimizers_stepped_in_a_loop.in.py"
    source = fixture.read_text()
    conversion = convert_source(source, Options(), filename="train.py")
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    assert "for optimizer in optimizers:\n            scaler.step(optimizer)\n        scaler.update()" in conversion.converted
    results = {}
    for side, code in (("fp32", source), ("amp", conversion.converted)):
        namespace = {"__name__": side}
        exec(compile(code, f"{side}.py", "exec"), namespace)
        torch.manual_seed(0)
        encoder, decoder, optimizers = namespace["main"]("cpu", epochs=2)
        assert all(optimizer.state for optimizer in optimizers), side  # every optimizer stepped
        results[side] = torch.cat([p.detach().flatten() for p in [*encoder.parameters(), *decoder.parameters()]])
    assert torch.allclose(results["amp"], results["fp32"], atol=5e-3), (results["amp"] - results["fp32"]).abs().max()


def test_clipping_before_a_loop_over_the_optimizers_sees_unscaled_gradients_on_cpu():
    """Clipping before `for optimizer in optimizers: optimizer.step()`: ampify writes `for optimizer in
    optimizers: scaler.unscale_(optimizer)` before the clip. Run on CPU (float16 autocast,
    GradScaler("cpu")), the clipped norms are those of the float32 run, not 65536 times larger, and
    the parameters move as the float32 run's do; without that loop the clip sees the scaled gradients."""
    import torch

    fixture = (Path(__file__).resolve().parent.parent / "fixtures" / "torch_native"
               / "optimizers_stepped_in_a_loop_after_clipping.in.py")
    source = fixture.read_text().replace('torch.device("cuda")', 'torch.device("cpu")').replace("range(100)", "range(3)")
    conversion = convert_source(source, Options(), filename="train.py")
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    assert "    for optimizer in optimizers:\n        scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_(" \
        in conversion.converted

    def run(code):
        norms = []
        original = torch.nn.utils.clip_grad_norm_

        def recording(parameters, max_norm, *args, **kwargs):
            norm = original(parameters, max_norm, *args, **kwargs)
            norms.append(float(norm))
            return norm

        torch.manual_seed(0)
        namespace = {"__name__": "script"}
        torch.nn.utils.clip_grad_norm_ = recording
        try:
            exec(compile(code, "train.py", "exec"), namespace)
        finally:
            torch.nn.utils.clip_grad_norm_ = original
        weights = torch.cat([p.detach().flatten() for p in [*namespace["encoder"].parameters(),
                                                             *namespace["decoder"].parameters()]])
        return norms, weights

    fp32_norms, fp32_weights = run(source)
    amp_norms, amp_weights = run(conversion.converted)
    assert len(amp_norms) == len(fp32_norms) == 3
    for mixed, full in zip(amp_norms, fp32_norms):
        assert mixed == pytest.approx(full, rel=2e-2)
    assert torch.allclose(amp_weights, fp32_weights, atol=5e-3)
    scaled_norms, _ = run(conversion.converted.replace(
        "    for optimizer in optimizers:\n        scaler.unscale_(optimizer)\n", ""))
    assert all(norm > 1000 * full for norm, full in zip(scaled_norms, fp32_norms))


def _lazy_regularization_log(folder: Path, *flags: str) -> dict:
    import json
    import subprocess

    completed = subprocess.run([sys.executable, "train.py", "--augment", "--iter", "4", *flags], cwd=folder,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout)


def test_lazy_regularization_steps_run_with_one_update_per_stepped_optimizer(tmp_path):
    """The golden stylegan2-style trainer (fixtures/repositories/lazy_regularization_steps), as
    converted: each network is stepped again in an `if` every other iteration, so update() follows
    its first step and the iteration's last update() sits in the generator's regularization branch.
    On CPU float16 all four iterations run (GradScaler raises on a second step between updates and
    on an update() with no step since the last one), and with a learning rate of 0 every loss and
    penalty equals the fp32 one; with training on, every value stays finite."""
    import shutil

    case = Path(__file__).resolve().parent.parent / "fixtures" / "repositories" / "lazy_regularization_steps"
    shutil.copytree(case / "input", tmp_path / "fp32")
    shutil.copytree(case / "input", tmp_path / "mixed")
    shutil.copy(case / "expected" / "train.py", tmp_path / "mixed" / "train.py")
    fp32 = _lazy_regularization_log(tmp_path / "fp32", "--lr", "0")
    mixed = _lazy_regularization_log(tmp_path / "mixed", "--lr", "0")
    assert [len(mixed[key]) for key in ("d", "r1", "g", "path")] == [4, 2, 4, 2]
    for key in fp32:
        assert mixed[key] == pytest.approx(fp32[key], rel=2e-2, abs=1e-3), key
    trained = _lazy_regularization_log(tmp_path / "mixed")
    assert all(math.isfinite(value) for values in trained.values() for value in values), trained


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_losses_handed_to_step_helpers_train_as_in_fp32(dtype, tmp_path):
    """p-christ's take_optimisation_step(): the callers' forward passes run under autocast and the
    helper scales, unscales before its clipping, steps and updates; the critic, actor and baseline
    losses of the converted run follow the fp32 run within the reduced dtype's tolerance (in
    float16 the first iteration's: GradScaler's initial scale overflows the baseline's first
    gradients, so that step is skipped, as designed, and the runs part by one SGD step)."""
    fp32 = run_script(str(script_path("step_helper_handed_the_loss"))).script_globals["LOSSES"]
    mixed = run_script(str(_convert("step_helper_handed_the_loss", dtype, tmp_path))).script_globals["LOSSES"]
    assert len(mixed) == len(fp32) == 12 and all(math.isfinite(loss) for loss in mixed)
    compared = 3 if dtype == "float16" else 12
    for converted, original in zip(mixed[:compared], fp32[:compared]):
        assert converted == pytest.approx(original, rel=3e-2, abs=2e-3), (mixed, fp32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_optimizers_taken_from_collections_train_as_in_fp32(dtype, tmp_path):
    """`optimizersD[i].step()` in a loop, `optims["G"].step()` and a namespace's
    `extra_optims.mapping.step()`: each goes through scaler.step(), so every optimizer steps on
    unscaled gradients and the discriminator and generator losses of the converted run follow the
    fp32 run (an optimizer left out of the scaler would step 65536 times too far in float16)."""
    fp32 = run_script(str(script_path("optimizers_in_collections"))).script_globals["LOSSES"]
    mixed = run_script(str(_convert("optimizers_in_collections", dtype, tmp_path))).script_globals["LOSSES"]
    assert len(mixed) == len(fp32) == 9
    for converted, original in zip(mixed, fp32):
        assert converted == pytest.approx(original, rel=3e-2, abs=3e-2), (mixed, fp32)


def test_a_probability_read_by_a_log_is_taken_from_the_logit_in_float32():
    """The premise of `torch.sigmoid(D(x).float())` where the fused model's output feeds a log (a GAIL
    reward, golden gail_reward_log_of_the_probability): under autocast the logit is float16, and a
    float16 sigmoid of a logit below about -17 rounds to 0, whose log is inf; the fp32 script's
    reward there is finite (20 for a logit of -20), and so is the converted one's."""
    import numpy as np

    logit = torch.tensor([-20.0], dtype=torch.float16)
    assert np.isinf(-np.log(torch.sigmoid(logit).numpy()))
    assert -np.log(torch.sigmoid(logit.float()).numpy())[0] == pytest.approx(20.0, rel=1e-3)
    converted = (SCRIPTS.parent / "gail_reward_log_of_the_probability.out.py").read_text()
    assert "-np.log(torch.sigmoid(discriminator(state_action).float()).cpu().data.numpy())" in converted


def test_a_log_of_the_probability_written_out_stays_finite_in_float16(tmp_path):
    """wiseodd's and MorvanZhou's GANs take `torch.log(1 - D_fake + 1e-8)` of D's sigmoid themselves
    (AMP229, refused before). Converted, D ends on logits and the log reads `torch.sigmoid(D_fake.float())`:
    run in fp32 the script computes the original's losses to 1e-6; in CPU float16 with D confident
    (a logit of 12, where a float16 sigmoid rounds to 1 and the log of the lost epsilon is -inf) every
    loss is finite and follows fp32's, while the same script with the sigmoid left in float16 under
    autocast gives a loss that is not finite."""
    import math

    conversion = convert_source(script_path("gan_log_of_probability_written_out").read_text(),
                                Options(backend="native", dtype="float16"))
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    assert "AMP248" in {f.code for f in conversion.findings}
    converted = conversion.converted
    assert "nn.Sigmoid()" not in converted.split('"""', 2)[2]  # after the docstring
    assert "torch.log(1 - torch.sigmoid(D_fake.float()) + 1e-8)" in converted
    fp32_form = tmp_path / "fp32_form.py"
    fp32_form.write_text(converted.replace("torch.autocast(", "torch.autocast(enabled=False, "))
    original = run_script(str(script_path("gan_log_of_probability_written_out"))).script_globals
    same = run_script(str(fp32_form)).script_globals
    assert same["LOSSES"] == pytest.approx(original["LOSSES"], abs=1e-6)
    assert same["PROBABILITIES"] == pytest.approx(original["PROBABILITIES"], abs=1e-6)
    for confident in (False, True):
        source = converted.replace("CONFIDENT = False", f"CONFIDENT = {confident}")
        script = tmp_path / f"mixed_{confident}.py"
        script.write_text(source)
        mixed = run_script(str(script)).script_globals["LOSSES"]
        reference = (tmp_path / f"fp32_{confident}.py")
        reference.write_text(script_path("gan_log_of_probability_written_out").read_text().replace(
            "CONFIDENT = False", f"CONFIDENT = {confident}"))
        fp32 = run_script(str(reference)).script_globals["LOSSES"]
        assert all(math.isfinite(loss) for loss in mixed), mixed
        assert mixed == pytest.approx(fp32, rel=2e-2, abs=2e-2), (mixed, fp32)
    # the premise: the original sigmoid under float16 autocast, D confident
    naive = tmp_path / "naive.py"
    naive.write_text(script_path("gan_log_of_probability_written_out").read_text()
                     .replace("CONFIDENT = False", "CONFIDENT = True")
                     .replace("        D_real = D(images)\n        D_fake = D(G(torch.randn(8, 4, device=device)))\n"
                              "        d_loss = ",
                              "        with torch.autocast('cpu', dtype=torch.float16):\n"
                              "            D_real = D(images)\n            D_fake = D(G(torch.randn(8, 4, device=device)))\n"
                              "        d_loss = "))
    assert "torch.autocast('cpu'" in naive.read_text()
    assert not math.isfinite(run_script(str(naive)).script_globals["LOSSES"][0])  # -inf, or NaN once it has stepped


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_helper_changing_the_gradients_sees_them_unscaled(dtype, tmp_path):
    """network-slimming's `updateBN()` adds s * sign(w) to the BatchNorm scales' gradients under a
    flag: the converted step shrinks them as the fp32 step does. (Added to scaled gradients, the
    term would be divided by the loss scale, 65536, and the scales would barely move.)"""
    name = "sparsity_added_to_gradients_by_a_helper"
    fp32 = run_script(str(script_path(name))).script_globals["BN_NORMS"]
    mixed = run_script(str(_convert(name, dtype, tmp_path))).script_globals["BN_NORMS"]
    assert len(mixed) == len(fp32) == 5
    assert fp32[-1] < 32 - 2, fp32  # the sparsity term moves the 32 scales (1.0 each at the start)
    for converted, original in zip(mixed, fp32):
        assert converted == pytest.approx(original, rel=1e-2), (mixed, fp32)


def test_a_float32_mode_beside_a_converted_one_runs(tmp_path):
    """The distillation mode's step stays float32 (a closure); the GradScaler exists in the other
    mode's branch only: the distillation mode must run to its checkpoints without a NameError."""
    name = "float32_mode_saving_beside_a_converted_one"
    conversion = convert_source(script_path(name).read_text(), Options(), filename=f"{name}.py")
    assert conversion.status is FileStatus.CHANGED_INCOMPLETE, conversion.reason
    converted = tmp_path / f"{name}.py"
    converted.write_text(conversion.converted)
    evidence = run_script(str(converted))
    assert set(evidence.script_globals["CHECKPOINTS"]) == {"kd"}
    assert "scaler" not in evidence.script_globals["CHECKPOINTS"]["kd"]
    assert len(evidence.script_globals["LOSSES"]) == 6


def test_a_step_built_by_a_trainer_factory_trains_as_the_fp32_step_on_cpu():
    """reid-strong-baseline's `create_supervised_trainer_with_center(model, ..., optimizer,
    optimizer_center, ...)` builds its step `_update` as a nested function: the GradScaler is
    created in the factory, before `_update`, which reads it from the closure; the center loss's
    gradients are multiplied by 1 / weight between backward() and the steps, as they are (a scaling
    commutes with the loss scale). Run on CPU (float16 autocast, GradScaler("cpu")): both optimizers
    step, and the model and the centers move as the float32 run's do."""
    import torch

    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "torch_native" / \
        "step_function_built_by_a_trainer_factory.in.py"
    source = fixture.read_text()
    conversion = convert_source(source, Options(), filename="train.py")
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    assert "    scaler = torch.amp.GradScaler(torch.device(device).type)\n\n    def _update(" in conversion.converted
    assert "scaler.unscale_(" not in conversion.converted
    results = {}
    for side, code in (("fp32", source), ("amp", conversion.converted)):
        namespace = {"__name__": side}
        exec(compile(code, f"{side}.py", "exec"), namespace)
        untrained = namespace["main"](torch.device("cpu"), steps=0)[1].centers.detach().clone()
        model, center = namespace["main"](torch.device("cpu"), steps=4)
        results[side] = (torch.cat([p.detach().flatten() for p in model.parameters()]), center.centers.detach().clone())
        assert (results[side][1] - untrained).abs().max() > 1e-3, side  # the centers' optimizer stepped
    assert torch.allclose(results["amp"][0], results["fp32"][0], atol=5e-3), \
        (results["amp"][0] - results["fp32"][0]).abs().max()
    assert torch.allclose(results["amp"][1], results["fp32"][1], atol=5e-3), \
        (results["amp"][1] - results["fp32"][1]).abs().max()


@pytest.mark.parametrize("flags", [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (0.0, 0.0)])
def test_conditional_steps_each_with_its_update_train_as_fp32_whichever_branches_run(flags, monkeypatch):
    """BicycleGAN's update_D(): two `if`s, each with its discriminator's zero_grad, backward and step.
    Converted, each step is followed by its own scaler.update(): whichever branches run, no scaler.step()
    repeats before an update() ("step() has already been called since the last update()") and no
    update() runs without a step ("No inf checks were recorded"). Run on CPU (float16 autocast,
    GradScaler("cpu") starting at scale 1, so that no first step is skipped for overflow, which would
    hide what is compared), the discriminators move as the float32 run's do."""
    import functools

    import torch

    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=1.0))

    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "torch_native" / \
        "each_conditional_step_in_its_own_branch.in.py"
    source = fixture.read_text()
    conversion = convert_source(source, Options(), filename="train.py")
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    assert conversion.converted.count("self.scaler.update()") == 2
    results = {}
    for side, code in (("fp32", source), ("amp", conversion.converted)):
        namespace = {"__name__": side}
        exec(compile(code, f"{side}.py", "exec"), namespace)
        torch.manual_seed(1)
        model = namespace["main"](*flags, device=torch.device("cpu"), steps=3)
        results[side] = torch.cat([p.detach().flatten() for p in [*model.netD.parameters(), *model.netD2.parameters()]])
        if side == "amp":
            assert model.scaler.get_scale() == 1.0  # no step skipped: what moved is what the fp32 run moves
    torch.manual_seed(0)
    assert (results["fp32"] - torch.cat([p.detach().flatten() for p in [
        *torch.nn.Linear(4, 1).parameters(), *torch.nn.Linear(4, 1).parameters()]])).abs().max() > 0.05 or not any(flags)
    assert torch.allclose(results["amp"], results["fp32"], atol=5e-3), (results["amp"] - results["fp32"]).abs().max()


def test_a_rollout_before_a_training_helper_gets_its_own_region_and_trains_as_fp32(monkeypatch):
    """RL-Adventure-2's GAIL: the rollout, then `ppo_update(...)` (a function that runs its own
    backward and step), then the discriminator's loss on the rollout's states and actions. Converted,
    the rollout and the discriminator's forward pass get a region each, and the call that trains sits
    in neither (an outer autocast region would hold ppo_update's backward and step). Run on CPU
    (float16 autocast, GradScaler("cpu") starting at scale 1), the policy and the discriminator move
    as the float32 run's do."""
    import functools

    import torch

    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=1.0))
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "torch_native" / \
        "rollout_before_a_training_helper.in.py"
    source = fixture.read_text()
    conversion = convert_source(source, Options(), filename="train.py")
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    region_lines = [line for line in conversion.converted.splitlines() if "torch.autocast(" in line]
    assert len(region_lines) == 3
    call = next(line for line in conversion.converted.splitlines() if "ppo_update(states, actions, returns)" in line
                and "def " not in line)
    assert call.startswith("            ppo_update(")  # the if's body in main's loop: outside any region
    results = {}
    for side, code in (("fp32", source), ("amp", conversion.converted)):
        namespace = {"__name__": side}
        exec(compile(code, f"{side}.py", "exec"), namespace)
        model, discriminator = namespace["main"](torch.device("cpu"), updates=3)
        results[side] = torch.cat([p.detach().flatten() for p in [*model.parameters(), *discriminator.parameters()]])
    torch.manual_seed(0)
    untrained = torch.cat([p.detach().flatten() for p in [
        *namespace["ActorCritic"]().parameters(), *torch.nn.Linear(6, 1).parameters()]])
    assert (results["fp32"] - untrained).abs().max() > 1e-2
    assert torch.allclose(results["amp"], results["fp32"], atol=5e-3), (results["amp"] - results["fp32"]).abs().max()
