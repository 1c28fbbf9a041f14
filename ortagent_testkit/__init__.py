"""Model builders shared by ortagent's tests and benchmarks (not part of the ortagent package).

Everything here builds ONNX models in code, with explicit IR versions and opsets, and the
references to check them against:

    onnx_models       small inference models for the binding tests
    training_graphs   training graphs in the ORTModule layout (one YieldOp), each with a NumPy
                      reference for its forward outputs and gradients
    bench_models      the benchmarks' inference models (also fed to the C floor) and the agent
                      group's ORTModule training graphs

The package lives at the top of the repository so that ``tests/`` and ``benchmarks/`` import it
by name from the repository root (pytest's ``pythonpath`` setting; ``python -m benchmarks.bench``).
It is left out of the wheel and the sdist: pyproject.toml lists the packages that ship.
"""
