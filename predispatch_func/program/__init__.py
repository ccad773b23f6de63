"""The program: what the call wrote (``mutations``), the graph signature built once at the
end (``signature``), the module call signatures torch.export writes (``module_signatures``),
and what ``ep.module()`` runs (``runtime``). ``aot.py`` drives the first three; ``export.py``
assembles the ExportedProgram with ``runtime``. Nothing here imports ``aot`` or ``export``.
"""
