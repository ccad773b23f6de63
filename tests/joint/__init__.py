"""Training graphs (predispatch_func/joint/): joint programs replayed against the reference's steps."""
