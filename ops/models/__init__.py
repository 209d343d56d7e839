"""Model files made for benchmarks and checks, reproducibly: `requantize_gguf` (the bundled GGUF in
another type)."""
