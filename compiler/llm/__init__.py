"""The GGUF LLM compiler: weights, calibration, quantization and the per-phase programs (build.py)."""
