"""What the Hugging Face tests call differently across the transformers releases ropekit supports.

transformers 5.23 renamed ``gradient_checkpointing_enable/disable`` to ``activation_checkpointing_enable/
disable`` (and their ``gradient_checkpointing_kwargs`` argument); the tests use whichever the installed
release has, so the same checks run at the oldest supported release and the newest.
"""


def checkpointing_on(model, **kwargs) -> None:
    """Turn activation (gradient) checkpointing on; ``kwargs`` are the checkpoint function's, e.g. use_reentrant."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(**({"activation_checkpointing_kwargs": kwargs} if kwargs else {}))
    else:
        model.gradient_checkpointing_enable(**({"gradient_checkpointing_kwargs": kwargs} if kwargs else {}))


def checkpointing_off(model) -> None:
    if hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()
