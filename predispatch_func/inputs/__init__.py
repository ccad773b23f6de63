"""Before the trace: is the call well formed (``input_check``), which inputs are dynamic
(``dynamic_shapes_spec``), what the graph's inputs are (``lift``: state and user inputs
become ``Inputs``; ``tied_names``, ``tensor_subclasses``), and their fakes (``fakeify``)."""
