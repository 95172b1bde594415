"""rkc's compiler: ONNX/GGUF -> IR -> segments -> NPU tasks -> one .rkbin file."""
