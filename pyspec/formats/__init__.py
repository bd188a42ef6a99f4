"""GGUF files and block formats: the reader, the writer of test models' bytes, and each format's reference dequantization."""
