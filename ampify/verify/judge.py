"""Turn what the probes recorded and what the script printed into a verdict.

A verdict is "verified" only on positive evidence that reduced precision really ran: grappler's
own count of converted nodes (TF1), or matmul/conv ops whose outputs were float16/bfloat16
(PyTorch, apex). Everything else is "not active" with the reason, or "script failed" when the
script ended before there was anything to judge.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ampify.verify.output_parsing import (
    APEX_OPT_LEVEL,
    AUTOCAST_DISABLED,
    GRAD_SCALER_DISABLED,
    GRAPPLER_NO_GPU,
    grappler_conversions,
    last_traceback_line,
)
from ampify.verify.result import CANNOT_VERIFY, NOT_ACTIVE, SCRIPT_FAILED, VERIFIED

REDUCED_DTYPES = ("float16", "bfloat16")

@dataclass
class RunFacts:
    """What the parent knows about the finished child process."""

    output: str
    probe: Dict[str, Any]
    returncode: Optional[int]
    timed_out: bool
    timeout: Optional[float]

    @property
    def stopped_early(self) -> bool:
        return bool(self.probe.get("stopped_early")) and not self.timed_out

    @property
    def failed(self) -> bool:
        """The script crashed, exited non-zero or ran out of time."""
        return self.timed_out or (not self.stopped_early and self.returncode not in (0, None))

    def failure_reason(self) -> str:
        if self.timed_out:
            return "timed out after %g s before any evidence" % self.timeout
        line = last_traceback_line(self.output)
        if line:
            return line
        exit_info = self.probe.get("exit", {})
        if exit_info.get("kind") == "sys.exit":
            return "the script called sys.exit(%s)" % exit_info.get("code")
        return "the script exited with code %s" % self.returncode


@dataclass
class Judgement:
    """Status, the evidence summary, the short verdict text and the reason when not verified."""

    status: str
    evidence: Dict[str, Any]
    verdict: str
    reason: Optional[str] = None


def _plural(count: int, word: str) -> str:
    return "%d %s%s" % (count, word, "" if count == 1 else "s")


def failed_or_not_active(facts: RunFacts, evidence: Dict[str, Any], reason: str) -> Judgement:
    """No positive evidence: a failure explains it if there was one, else mixed precision is off."""
    if facts.failed:
        failure = facts.failure_reason()
        return Judgement(SCRIPT_FAILED, evidence, "script failed: %s" % failure, failure)
    return Judgement(NOT_ACTIVE, evidence, "not active: %s" % reason, reason)


def _tf1_cannot_verify_reason(probe: Dict[str, Any], sessions: List[Dict[str, Any]]) -> Optional[str]:
    """Why this TensorFlow cannot show the rewrite on this machine, if that is the case."""
    if any(s.get("cpu_emulation_error") for s in sessions if s.get("rewrite_enabled")):
        return ("TensorFlow %s has no CPU mode of grappler's mixed precision pass "
                "(auto_mixed_precision_cpu): verify on a machine with a GPU" % probe.get("version", "?"))
    if probe.get("probe_errors"):
        return "the probe could not hook TensorFlow %s: %s" % (probe.get("version", "?"), probe["probe_errors"][0])
    return None


def judge_tf1(facts: RunFacts) -> Judgement:
    """TF1 graph rewrite: grappler must log a conversion of N > 0 nodes."""
    probe = facts.probe.get("tf1", {})
    sessions = probe.get("sessions", [])
    conversions = grappler_conversions(facts.output)
    best = max(conversions, key=lambda c: c.converted, default=None)
    cpu_emulation = any(s.get("cpu_emulation") for s in sessions)
    evidence = {
        "grappler_conversions": [c.__dict__ for c in conversions],
        "sessions": len(sessions),
        "sessions_with_rewrite": sum(1 for s in sessions if s.get("rewrite_enabled")),
        "cpu_emulation": cpu_emulation,
        "training_steps": probe.get("train_steps", 0),
        "training_steps_with_rewrite": probe.get("train_steps_with_rewrite", 0),
        "training_steps_loss_scaled": probe.get("train_steps_loss_scaled", 0),
    }
    # float16 without loss scaling is no AMP training: tf.gradients fed to the wrapper's
    # apply_gradients never go through its compute_gradients, so the loss is never scaled.
    unscaled_steps = probe.get("train_steps_not_loss_scaled", 0)
    if unscaled_steps and not evidence["training_steps_loss_scaled"] and not facts.failed:
        reason = ("the float16 graph rewrite ran, but the training op applies gradients that never went through the "
                  "wrapped optimizer's compute_gradients (tf.gradients fed to apply_gradients, or an optimizer left "
                  "unwrapped): the loss is not scaled and float16 gradients can underflow silently")
        return Judgement(NOT_ACTIVE, evidence, "not active: %s" % reason, reason)
    # A training step that ran in a Session without the rewrite is fp32 training, whatever
    # another (e.g. evaluation) Session converted.
    trained_without_rewrite = evidence["training_steps"] > 0 and not evidence["training_steps_with_rewrite"]
    if (best is not None and best.converted > 0 and not trained_without_rewrite
            and not (facts.failed and not evidence["training_steps"])):
        where = " (CPU emulation)" if cpu_emulation else ""
        steps = evidence["training_steps_with_rewrite"]
        step_text = _plural(steps, "training step") if steps else "no training step seen"
        verdict = "verified: %d/%d nodes converted to %s%s, %s" % (
            best.converted, best.total, best.dtype, where, step_text)
        return Judgement(VERIFIED, evidence, verdict)
    cannot = _tf1_cannot_verify_reason(probe, sessions)
    if cannot and not facts.failed:
        return Judgement(CANNOT_VERIFY, evidence, "cannot verify here: %s" % cannot, cannot)
    if "tf1" not in facts.probe:
        reason = "the script never imported TensorFlow"
    elif any(s.get("switched_off_by_config") for s in sessions):
        reason = "the Session's config switches grappler's auto_mixed_precision OFF"
    elif not sessions:
        reason = "no tf.Session was created (the TF1 graph rewrite only acts on Sessions)"
    elif not evidence["sessions_with_rewrite"] or trained_without_rewrite:
        reason = ("the mixed precision graph rewrite was not enabled when the training Session was created "
                  "(enable_mixed_precision_graph_rewrite must wrap the optimizer before tf.Session)")
    elif GRAPPLER_NO_GPU.search(facts.output):
        reason = "grappler found no GPU with compute capability 7.0+ and skipped the mixed precision pass"
    elif conversions:
        reason = "grappler's mixed precision pass converted 0 nodes (no allowlisted ops in the graph)"
    else:
        reason = "the graph rewrite was enabled but grappler logged no conversion for any graph that ran"
    return failed_or_not_active(facts, evidence, reason)


def _torch_op_counts(probe: Dict[str, Any]) -> Tuple[Dict[str, int], Dict[str, int]]:
    ops = probe.get("ops", {})
    return ops.get("forward", {}), ops.get("backward", {})


def _silently_fp32_reasons(facts: RunFacts, probe: Dict[str, Any]) -> List[str]:
    """autocast / GradScaler that disabled themselves because the device they name is missing."""
    reasons = []
    disabled = [r for r in probe.get("autocast", []) if r.get("requested") and not r.get("enabled")]
    if disabled or AUTOCAST_DISABLED.search(facts.output):
        device = disabled[0]["device_type"] if disabled else "cuda"
        reasons.append("torch.autocast(%r) disabled itself (CUDA is not available)" % device)
    scalers = [r for r in probe.get("grad_scaler", []) if r.get("requested") and not r.get("enabled")]
    if scalers or GRAD_SCALER_DISABLED.search(facts.output):
        reasons.append("GradScaler disabled itself (CUDA is not available)")
    return reasons


def _float16_without_loss_scaling(probe: Dict[str, Any], backward: Dict[str, int], steps: int, apex: bool) -> Optional[str]:
    """float16 backward passes and optimizer steps, with no loss a GradScaler scaled: not AMP
    training (small gradients underflow in float16). bfloat16 needs no scaling; apex scales its own."""
    if apex or "scaler_scale_calls" not in probe or probe["scaler_scale_calls"] or not steps:
        return None
    if not backward.get("float16"):
        return None
    if any(r.get("enabled") for r in probe.get("grad_scaler", [])):
        return ("a GradScaler was created but never scaled a loss (scaler.scale(loss).backward() is missing): "
                "the float16 backward pass ran unscaled, and small gradients underflow silently")
    return ("float16 backward passes ran without loss scaling (no torch.amp.GradScaler): small gradients underflow "
            "silently; add a GradScaler, or use bfloat16")


def _apex_float16_without_scale_loss(apex_probe: Dict[str, Any], backward: Dict[str, int], steps: int) -> Optional[str]:
    """apex scales a loss only inside `with amp.scale_loss(loss, optimizer) as scaled:`; a plain
    `loss.backward()` after amp.initialize runs the float16 backward pass unscaled (and, at O2,
    never copies the gradients to the float32 master weights)."""
    if "scale_loss_calls" not in apex_probe or apex_probe["scale_loss_calls"] or not steps:
        return None
    if not backward.get("float16"):
        return None
    return ("apex amp.initialize ran, but no backward pass went through amp.scale_loss (a plain loss.backward() "
            "is missing `with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()`): the float16 "
            "backward pass ran unscaled, and small gradients underflow silently")


def judge_torch(facts: RunFacts, apex: bool = False) -> Judgement:
    """Native torch AMP or apex: matmul/conv ops must have run in float16/bfloat16."""
    probe = facts.probe.get("torch", {})
    forward, backward = _torch_op_counts(probe)
    reduced_fwd = sum(forward.get(d, 0) for d in REDUCED_DTYPES)
    reduced_bwd = sum(backward.get(d, 0) for d in REDUCED_DTYPES)
    total = sum(v for k, v in forward.items() if k != "none") + sum(v for k, v in backward.items() if k != "none")
    reduced = reduced_fwd + reduced_bwd
    dtypes = [d for d in REDUCED_DTYPES if forward.get(d) or backward.get(d)]
    steps = probe.get("optimizer_steps", 0)
    silent = _silently_fp32_reasons(facts, probe)
    apex_probe = facts.probe.get("apex", {})
    evidence = {
        "reduced_precision_ops": reduced,
        "counted_ops": total,
        "forward": forward,
        "backward": backward,
        "optimizer_steps": steps,
        "autocast": probe.get("autocast", []),
        "grad_scaler": probe.get("grad_scaler", []),
    }
    if apex:
        evidence["apex_initialized"] = bool(apex_probe.get("initialized"))
        evidence["apex_opt_level"] = apex_probe.get("opt_level")
        # apex prints its banner before it checks the device: informative, never proof
        evidence["apex_banner_printed"] = bool(APEX_OPT_LEVEL.search(facts.output))
    if silent:
        reason = "; ".join(silent) + ": the script silently ran in float32"
        return Judgement(NOT_ACTIVE, evidence, "not active: %s" % reason, reason)
    unscaled = _float16_without_loss_scaling(probe, backward, steps, apex)
    if apex:
        evidence["apex_scale_loss_calls"] = apex_probe.get("scale_loss_calls")
        if "loss_scale" in apex_probe:
            evidence["apex_loss_scale"] = apex_probe["loss_scale"]
        unscaled = _apex_float16_without_scale_loss(apex_probe, backward, steps)
    if unscaled and not facts.failed:
        evidence["scaler_scale_calls"] = probe.get("scaler_scale_calls", 0)
        return Judgement(NOT_ACTIVE, evidence, "not active: %s" % unscaled, unscaled)
    apex_ok = not apex or evidence["apex_initialized"]
    # Training in mixed precision shows in the backward pass too: reduced-precision ops only in
    # forward passes (an evaluation under autocast) next to an fp32 backward are not AMP training.
    backward_total = sum(v for k, v in backward.items() if k != "none")
    fp32_backward = steps > 0 and backward_total > 0 and reduced_bwd == 0
    if reduced > 0 and apex_ok and not fp32_backward and not (facts.failed and not steps):
        verdict = "verified: %d/%d matmul/conv ops ran in %s (fwd %d, bwd %d), %s" % (
            reduced, total, "/".join(dtypes), reduced_fwd, reduced_bwd, _plural(steps, "optimizer step"))
        if apex:
            verdict += ", apex amp %s" % (evidence["apex_opt_level"] or "")
            calls = evidence["apex_scale_loss_calls"]
            if calls:
                verdict += ", amp.scale_loss scaled %d loss%s" % (calls, "" if calls == 1 else "es")
        return Judgement(VERIFIED, evidence, verdict.rstrip())
    if "torch" in facts.probe and probe.get("op_counter") != "active" and not facts.failed:
        errors = "; ".join(probe.get("probe_errors", [])) or "unknown reason"
        reason = "the probe cannot count ops on torch %s (needs torch 2.0+): %s" % (probe.get("version", "?"), errors)
        return Judgement(CANNOT_VERIFY, evidence, "cannot verify here: %s" % reason, reason)
    if "torch" not in facts.probe:
        reason = "the script never imported torch"
    elif apex and not evidence["apex_initialized"]:
        reason = "apex amp.initialize was never called or did not return"
    elif fp32_backward and reduced:
        reason = ("reduced-precision ops ran only in forward passes (%d), the backward pass ran all %d ops in "
                  "float32: the training forward pass is not under autocast" % (reduced_fwd, backward_total))
    elif total == 0:
        reason = "no matmul/conv/attention op ran%s" % (" before the optimizer step" if steps else "")
    else:
        reason = "0/%d matmul/conv ops ran in float16/bfloat16 (no autocast region around the forward pass)" % total
    return failed_or_not_active(facts, evidence, reason)


def judge_keras(facts: RunFacts) -> Judgement:
    """Keras: a mixed policy when the first training step ran, the model's layers computing in it,
    and for float16 a LossScaleOptimizer (compile adds it; a custom loop must)."""
    probe = facts.probe.get("keras", {})
    layers = probe.get("layers", [])
    policy = probe.get("policy") or probe.get("policy_at_fit")
    evidence = {"policy": policy, "optimizer": probe.get("optimizer"), "layers": layers,
                "keras_version": probe.get("version"), "training_steps": probe.get("steps", 0)}
    reduced = [name for name, dtype in layers if dtype in REDUCED_DTYPES]
    if "keras" not in facts.probe:
        return failed_or_not_active(facts, evidence, "the script never imported Keras")
    if not probe.get("steps"):
        return failed_or_not_active(facts, evidence, "no optimizer step ran (no fit or apply_gradients)")
    if not (policy or "").startswith("mixed_"):
        reason = ("the dtype policy is %s when training starts: set keras.mixed_precision.set_global_policy("
                  "'mixed_float16') before the model is built" % (policy or "unknown"))
        return failed_or_not_active(facts, evidence, reason)
    if layers and not reduced:
        reason = ("the policy is %s but all %d layers with weights compute in float32: the policy was set after the "
                  "model was built (a late policy does nothing)" % (policy, len(layers)))
        return failed_or_not_active(facts, evidence, reason)
    traced = probe.get("traced_ops") or {}
    traced_reduced = sum(count for dtype, count in traced.items() if dtype in REDUCED_DTYPES)
    evidence["traced_step_ops"] = traced
    if traced and not traced_reduced:
        reason = ("the policy is %s but all %d matmul/conv ops of the traced training step run in %s"
                  % (policy, sum(traced.values()), ", ".join(sorted(traced))))
        return failed_or_not_active(facts, evidence, reason)
    if policy == "mixed_float16" and not str(probe.get("optimizer", "")).startswith("LossScaleOptimizer"):
        reason = ("mixed_float16 training with a %s that is no LossScaleOptimizer: float16 gradients are not "
                  "loss-scaled and can underflow silently" % probe.get("optimizer"))
        return failed_or_not_active(facts, evidence, reason)
    where = ("%d/%d layers with weights compute in %s" % (len(reduced), len(layers), policy.replace("mixed_", ""))
             if layers else "custom loop")
    verdict = "verified: policy %s, %s, optimizer %s" % (policy, where, probe.get("optimizer"))
    if traced:
        verdict += ", %d/%d matmul/conv ops of the traced step in %s" % (
            traced_reduced, sum(traced.values()), policy.replace("mixed_", ""))
    return Judgement(VERIFIED, evidence, verdict)


def judge_gluon(facts: RunFacts) -> Judgement:
    """MXNet Gluon: amp.init ran, the network computed in its reduced dtype while autograd recorded
    (or its hybridized graph holds amp_cast nodes), and for float16 the trainer that stepped has
    amp's loss scaler and the loss was scaled."""
    probe = facts.probe.get("gluon", {})
    init = probe.get("amp_init")
    outputs = probe.get("outputs", [])
    target = (init or {}).get("target_dtype")
    evidence = {"amp_target_dtype": target, "network_outputs": outputs, "training_steps": probe.get("steps", 0),
                "loss_scaler": probe.get("loss_scaler"), "scale_loss_calls": probe.get("scale_loss_calls", 0),
                "mxnet_version": probe.get("version")}
    if "gluon" not in facts.probe:
        return failed_or_not_active(facts, evidence, "the script never imported MXNet")
    if not probe.get("steps"):
        return failed_or_not_active(facts, evidence, "no trainer step ran (trainer.step or trainer.update)")
    if init is None:
        return failed_or_not_active(facts, evidence, "amp.init() was never called: the network trains in float32")
    reduced = [o for o in outputs if o[1] in REDUCED_DTYPES]
    casts = sum(o[2] or 0 for o in outputs)
    if outputs and not reduced and not casts:
        late = " (the network ran before amp.init)" if init.get("outputs_before") else ""
        reason = ("amp.init(target_dtype=%r) ran but the network's outputs are %s and its graphs hold no amp_cast "
                  "node: the network was built or hybridized before amp.init()%s" % (target, outputs[0][1], late))
        return failed_or_not_active(facts, evidence, reason)
    if target == "float16" and not (probe.get("loss_scaler") and probe.get("scale_loss_calls")):
        missing = "amp.init_trainer" if not probe.get("loss_scaler") else "amp.scale_loss"
        reason = ("float16 training without loss scaling (no %s): float16 gradients can underflow silently"
                  % missing)
        return failed_or_not_active(facts, evidence, reason)
    shown = ", ".join(part for part in (
        ("network output in %s" % reduced[0][1]) if reduced else "",
        ("%d amp_cast nodes in the hybridized graph" % casts) if casts else "",
    ) if part) or "no network call seen while recording"
    scaling = (", loss scale %g" % probe["loss_scale"]) if probe.get("loss_scaler") and probe.get("loss_scale") else ""
    verdict = "verified: amp.init(target_dtype=%s), %s%s" % (target, shown, scaling)
    return Judgement(VERIFIED, evidence, verdict)
