"""The program: what it returns, the layouts of inputs it carries, its write-backs (what ep.module() runs)."""
