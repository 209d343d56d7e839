"""What the tests run against: real deployments and an API server, tiny random models (and their
GGUF files), the greedy reference, a ghost lease owner. Imported as `harness.<module>`."""
