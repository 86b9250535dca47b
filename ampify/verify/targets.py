"""What `ampify verify` knows about each target: how its scripts are recognised, which probe
records their evidence, how the run is prepared, and which judge reads the evidence.

A conversion target names its verify target (`Target.verify` in transforms/<target>/target.py);
a new target adds one entry here and, where it needs one, a probe module under probes/.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Tuple

from ampify.verify import detect
from ampify.verify.judge import Judgement, RunFacts, failed_or_not_active, judge_gluon, judge_keras, judge_tf1, judge_torch

LEGACY_KERAS_NOTE = (
    "ran with TF_USE_LEGACY_KERAS=1: TF1 code needs Keras 2 (tf-keras) on TensorFlow >= 2.16; "
    "set TF_USE_LEGACY_KERAS yourself to override"
)


@dataclass(frozen=True)
class VerifyTarget:
    """One kind of script `ampify verify` can judge."""

    name: str  # what verify/detect.py returns for its scripts
    framework: str  # as reported: "tensorflow", "torch", "mxnet"
    backend: str  # as reported: "tf1_graph_rewrite", "keras_policy", "torch_native", "apex", "gluon_amp"
    #: the probe module (under probes/) that records this target's evidence
    probe: str
    judge: Callable[[RunFacts], Judgement]
    #: environment set for the run unless the user set it, with the note that says so
    environment: Tuple[Tuple[str, str, str], ...] = ()
    #: the run is pointless without a CUDA GPU (apex amp.initialize refuses CPU models)
    needs_cuda: bool = False


def _unknown(facts: RunFacts) -> Judgement:
    return failed_or_not_active(facts, {}, "the script imported neither TensorFlow, PyTorch nor MXNet")


VERIFY_TARGETS: Dict[str, VerifyTarget] = {
    target.name: target
    for target in (
        VerifyTarget(
            detect.TF1, "tensorflow", "tf1_graph_rewrite", "_ampify_probe_tf1", judge_tf1,
            # TF1 code (tf.layers, tf.compat.v1 Keras-backed APIs) needs Keras 2: on TF >= 2.16
            # `tf.keras` is Keras 3 unless this is set, and `tf.layers.dense` fails there.
            environment=(("TF_USE_LEGACY_KERAS", "1", LEGACY_KERAS_NOTE),),
        ),
        VerifyTarget(detect.KERAS, "tensorflow", "keras_policy", "_ampify_probe_keras", judge_keras),
        VerifyTarget(detect.TORCH, "torch", "torch_native", "_ampify_probe_torch", judge_torch),
        VerifyTarget(
            detect.APEX, "torch", "apex", "_ampify_probe_torch",
            lambda facts: judge_torch(facts, apex=True), needs_cuda=True,
        ),
        VerifyTarget(detect.GLUON, "mxnet", "gluon_amp", "_ampify_probe_gluon", judge_gluon),
        VerifyTarget(detect.UNKNOWN, "unknown", "unknown", "", _unknown),
    )
}


def judge(backend: str, facts: RunFacts) -> Tuple[str, Judgement]:
    """The verdict for a finished run; an unknown backend is decided by what the script imported."""
    if backend == detect.UNKNOWN:
        if facts.probe.get("tf1", {}).get("sessions"):
            backend = detect.TF1
        elif facts.probe.get("keras", {}).get("steps"):
            backend = detect.KERAS
        elif facts.probe.get("gluon", {}).get("steps"):
            backend = detect.GLUON
        elif "torch" in facts.probe:
            backend = detect.TORCH
        elif "tf1" in facts.probe:
            backend = detect.TF1
    judgement = VERIFY_TARGETS[backend].judge(facts)
    if facts.timed_out and judgement.status == "verified":
        judgement.verdict += ", stopped by the %g s timeout" % facts.timeout
    return backend, judgement
