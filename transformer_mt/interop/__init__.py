"""The interoperability layer: a trained model in other toolkits' formats (Hugging Face Transformers,
ONNX, a page that translates in the browser), and their models as a run's starting point."""
