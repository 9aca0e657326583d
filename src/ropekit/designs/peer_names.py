"""Names the public Multimodal-RoPEs collection uses for designs ropekit already had."""
from .registry import alias

alias("vanilla", "vanilla-rope")
alias("circle", "circlerope", "circle-rope")
