"""Guess a variable's kind (model, optimizer, trainer, …) from its name."""

from __future__ import annotations

import re
from functools import lru_cache

_RULES: list[tuple[str, re.Pattern]] = [
    # training arguments and loop state (Megatron's ``args``, DeepSpeed's ``ds_config``,
    # Lightning's ``loops`` and ``callbacks``): settings, whatever their names say
    (
        "trainer",
        re.compile(
            r"(^|/)(args|hparams|hyper_parameters|training_args|ds_config)(/|$)"
            r"|^(loops|callbacks)(/|$)",
            re.I,
        ),
    ),
    (
        "rng",
        re.compile(r"(^|/)(rng|rng_state|random|torch_rng|cuda_rng|python_rng|numpy_rng)", re.I),
    ),
    (
        "scheduler",
        re.compile(r"(^|/)(scheduler|lr_scheduler|lr_schedulers|opt_param_scheduler)(/|$)", re.I),
    ),
    ("lookup_table", re.compile(r"(^|/)(__lookup_table__|lookup_table)", re.I)),
    (
        "optimizer",
        re.compile(
            r"(^|/)(optimizer|optimizers|optim|opt|opt_state|optimizer_states)(/|$)"
            r"|_moment\d|_beta\d_pow_acc|_velocity_|exp_avg|momentum_buffer|_accumulator"
            r"|\.OPTIMIZER_SLOT|(^|/)(adam|sgd)_|@GRAD",
            re.I,
        ),
    ),
    (
        "trainer",
        re.compile(
            r"(^|/)(epoch_id|step_id|epoch|global_step|global_steps|skipped_steps|step"
            r"|trainer_state|iteration"
            r"|checkpoint_version|num_floating_point_operations_so_far)$|^args/",
            re.I,
        ),
    ),
]


@lru_cache(maxsize=1 << 16)  # names repeat across serials: 1e6 rows, 1e3 distinct names
def guess_kind(name: str) -> str:
    """The kind of a variable from its (prefixed) name; ``model`` when nothing else fits."""
    for kind, pattern in _RULES:
        if pattern.search(name):
            return kind
    return "model"


_OPTIMIZER = re.compile(
    r"_(moment\d*|velocity|beta\d_pow_acc|mean_square|mean_grad|squared|linear|inf_norm"
    r"|avg_squared_grad|avg_squared_update|fp32_master|master)_\d+$"
    r"|^learning_rate_\d+$|@LR_DECAY_COUNTER@|^global_step$"
)


def paddle_kind(name: str) -> str:
    """A Paddle variable's kind: accumulators and the learning rate are optimizer state."""
    return "optimizer" if _OPTIMIZER.search(name) else guess_kind(name)
