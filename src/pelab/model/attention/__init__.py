"""Causal attention: one dispatch point (`dispatch.causal_attention`) for every encoding, and its paths, a module
each: SDPA with an additive mask (`sdpa`), FlexAttention (`flex`), explicit logits at evaluation (`logits`),
stick-breaking attention (`stickbreaking`), local spans (`span`), and the record of the path each scheme took
(`record`: logged under this package's name, written to summary.json). The modules import each other's public
names only."""

from pelab.model.attention.dispatch import attention_paths, causal_attention, reference_attention
from pelab.model.attention.record import reset_attention_paths

__all__ = ["attention_paths", "causal_attention", "reference_attention", "reset_attention_paths"]
