"""Solution to notebook 13's exercise: the bytes one parameter costs between training steps.

The parameters and their gradients in the compute dtype; under mixed precision a float32 master
copy that the optimizer updates; the optimizer's state arrays (SGD none, momentum one, Adam two),
in the master copy's dtype. The loss scaler is one number, not per parameter.

>>> bytes_per_param("adam", "fp32"), bytes_per_param("adam", "bf16_master")   # ZeRO's 16 and 2 + 2 + 12
(16, 16)
"""

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
POLICIES = {"fp64": ("float64", None), "fp32": ("float32", None),
            "bf16_master": ("bfloat16", "float32"), "fp16_scaler": ("float16", "float32")}
STATE_ARRAYS = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}


def bytes_per_param(optimizer, dtype_policy):
    low, master = POLICIES[dtype_policy]
    s = ITEMSIZE[low]
    held = 2 * s                                           # the parameter and its gradient
    if master is not None:
        held += ITEMSIZE[master]                           # the master copy the optimizer steps
    return held + STATE_ARRAYS[optimizer] * ITEMSIZE[master or low]
