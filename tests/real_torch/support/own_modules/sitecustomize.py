"""The program's own sitecustomize: it must still run, once."""
import os

os.environ["OWN_SITECUSTOMIZE_RUNS"] = str(int(os.environ.get("OWN_SITECUSTOMIZE_RUNS", "0")) + 1)
