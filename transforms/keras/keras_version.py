"""Which Keras a module's imports mean, decided by the repository's version pins where the imports
alone cannot: `tf.keras` is Keras 2 before TensorFlow 2.16 and Keras 3 from it; `import keras` is
Keras 3 from Keras 3.0 (and with TensorFlow >= 2.16), Keras 2 before; `import tf_keras` is Keras 2.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ampify.dependency_pins import allowed_range

KERAS_3 = "keras 3"
KERAS_2 = "keras 2"
EITHER = "either"

_TENSORFLOW = ("tensorflow", "tensorflow-gpu", "tensorflow-cpu", "tensorflow-macos", "tf-nightly")
_TF_KERAS_3 = (2, 16)
_KERAS_3 = (3,)


def _pin(pins: Dict[str, Tuple[str, str]], names) -> Optional[Tuple[str, str, str]]:
    for name in names:
        if name in pins:
            return name, *pins[name]
    return None


def _side(spec: str, boundary: Tuple[int, ...]) -> Optional[bool]:
    """True: every allowed version is at or above `boundary`; False: every one below; None: both."""
    low, high = allowed_range(spec)
    if high <= boundary:
        return False
    if low >= boundary:
        return True
    return None


def keras_api(roots: List[str], pins: Dict[str, Tuple[str, str]]) -> Tuple[str, str]:
    """(KERAS_2 / KERAS_3 / EITHER, why) for a module importing Keras through `roots` (none: it
    reaches Keras as `tf.keras` through `import tensorflow`)."""
    roots = roots or ["tensorflow.keras"]
    decided = set()
    reasons = []
    for root in roots:
        if root == "tf_keras":
            decided.add(KERAS_2)
            reasons.append("`import tf_keras` is Keras 2")
            continue
        tensorflow = _pin(pins, _TENSORFLOW)
        keras = _pin(pins, ("keras",))
        if root == "keras" and keras is not None and _side(keras[1], _KERAS_3) is not None:
            api = KERAS_3 if _side(keras[1], _KERAS_3) else KERAS_2
            decided.add(api)
            reasons.append(f"{keras[2]} pins keras{keras[1]}")
            continue
        if tensorflow is None or _side(tensorflow[1], _TF_KERAS_3) is None:
            return EITHER, "the imports and the repository's pins cannot tell which Keras runs"
        newer = _side(tensorflow[1], _TF_KERAS_3)
        if newer and root != "keras" and "tf-keras" in pins:
            return EITHER, (f"{tensorflow[2]} pins {tensorflow[0]}{tensorflow[1]} and tf-keras is pinned too "
                            "(TF_USE_LEGACY_KERAS=1 makes tf.keras Keras 2)")
        decided.add(KERAS_3 if newer else KERAS_2)
        reasons.append(f"{tensorflow[2]} pins {tensorflow[0]}{tensorflow[1]}, whose "
                       f"{'tf.keras' if root != 'keras' else 'keras'} is Keras {3 if newer else 2}")
    if len(decided) != 1:
        return EITHER, "the module's Keras imports mean different Kerases"
    return decided.pop(), "; ".join(reasons)
