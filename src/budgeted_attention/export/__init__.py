"""Deployment formats: ONNX graphs per budget (``baa export``)."""
