"""Ways to run a round's client fits other than one after the other: ``cohort`` (all at once
with ``torch.func.vmap``)."""
