"""The C floor: ort_floor.c calls the onnxruntime C API straight from C; ``build`` compiles and
runs it (``python -m benchmarks.c_floor.build``)."""
