"""ONNX graphs before QNN: ONNX facts, model code loading, packaged export, the rewrite catalogue."""
