import sys
from pathlib import Path

# programs.py (the tests' reference task builder) sits beside the tests
sys.path.insert(0, str(Path(__file__).resolve().parent))
