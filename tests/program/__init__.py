"""The program: signature and metadata, the torch.export drop-in, verify over several calls."""
