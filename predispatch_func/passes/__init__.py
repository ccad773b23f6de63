"""After the trace and the region stage: graph passes over the functional program
(``graph_cleanup``: constants, placeholder names, dead code, outputs read by write-backs;
``writeback_guard``), and the node metadata torch.export writes (``node_meta``,
``stack_trace_files``)."""
