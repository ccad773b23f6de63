"""Export a 7B-parameter Llama config built on the ``meta`` device; print time and peak RSS.

Run as its own process so the peak resident memory (``ru_maxrss``) is this
export's alone: ``python scripts/export_7b_on_meta.py [--layers N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def llama_7b_config(layers: int = 32):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=32,
                       max_position_embeddings=4096, use_cache=False)


def build_on_meta(layers: int = 32):
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(llama_7b_config(layers)).eval()
        ids = torch.zeros(1, 16, dtype=torch.long)
    return model, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    opts = parser.parse_args()
    import torch

    import predispatch_func as pf

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    model, ids = build_on_meta(opts.layers)
    params = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    ep = pf.export(model, (ids,))
    seconds = time.perf_counter() - start
    report = pf.check_contract(ep)
    result = {
        "layers": opts.layers,
        "parameters": params,
        "export_seconds": round(seconds, 2),
        "nodes": len(ep.graph.nodes),
        "contract_ok": report.ok,
        "peak_rss_mib_after_imports": round(rss_before, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "torch": torch.__version__,
    }
    print(json.dumps(result) if opts.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
