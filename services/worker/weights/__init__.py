"""Reading weights into the model: checkpoint folders, GGUF files, quantized checkpoint formats, the
bundled model. `loader.load_model` is the one entry point; nothing here defines a layer."""
