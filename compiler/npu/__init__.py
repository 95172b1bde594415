"""Graph-free NPU op emitters: one NPU operation -> chained regcmd tasks (see api.py)."""
