"""The Python-state guard: what ``forward`` writes outside tensors, judged over calls.

``state_guard`` snapshots the caller's model and restores it on every path;
``python_state`` judges attribute writes (carried, refused or warned), reading
``access_order``, ``state_memos`` and ``module_access``; ``tensor_attribute_writes``
and ``leaks`` find tensors the program would otherwise lose or leak.
"""
