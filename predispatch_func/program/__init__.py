"""The stages around the trace, in pipeline order.

``input_check`` (is the call well formed) -> ``state_guard`` (snapshot and restore
the caller's state) -> ``lift`` (state and user inputs become ``Inputs``) ->
``fakeify`` -> [the trace, ``modes/``] -> ``mutations`` (what the call wrote) ->
``graph_cleanup`` and ``writeback_guard`` (graph passes) -> ``signature`` (built
once) -> ``node_meta`` / ``module_signatures`` (metadata torch.export writes).
``aot.py`` drives them; nothing here imports ``aot`` or ``export``.
"""
