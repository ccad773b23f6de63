"""Backend op sets: lowering into a target, the ops report and its command."""
