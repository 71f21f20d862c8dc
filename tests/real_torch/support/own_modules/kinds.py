"""The program's own module named like a file of oomshim's hook."""
KINDS = ("train", "eval")
