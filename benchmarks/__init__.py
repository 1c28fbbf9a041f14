"""ortagent's benchmarks, side by side with onnxruntime's Python API, the C floor and
onnxruntime-training 1.19.2's agent: ``python -m benchmarks.bench`` from the repository root
(``make bench``). See benchmarks/README.md. Not part of the ortagent package."""
