"""The learning-rate schedule of section 5.3."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lrate = scale * d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)`.

    Linear warm-up for `warmup_steps`, then decay with the inverse square root of the step
    (section 5.3; `scale` = 1 in the paper). Keras passes the optimizer's `iterations`, which
    counts from 0, so `step_num = iterations + 1`: the first update already has a learning rate.

    Args:
        d_model: the model width.
        warmup_steps: 4000 in the paper.
        scale: a constant factor on the whole schedule.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step_num = ops.cast(step, "float32") + 1.0
        decay = ops.minimum(ops.rsqrt(step_num), step_num * self.warmup_steps**-1.5)
        return self.scale * self.d_model**-0.5 * decay

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


def paper_optimizer(schedule):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on `schedule`, a `TransformerSchedule`
    (section 5.3)."""
    return keras.optimizers.Adam(learning_rate=schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
