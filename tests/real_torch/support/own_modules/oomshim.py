"""The program's own module named `oomshim` (oomshim not installed)."""
MINE = True
