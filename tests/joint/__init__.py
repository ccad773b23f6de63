"""Training graphs (predispatch_func/joint/): joint programs replayed against eager steps."""
