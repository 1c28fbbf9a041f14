"""onnxruntime-training 1.19.2's real TrainingAgent and ORTModule graph builder, run in their own
environment (``.venv-refagent``): ``client`` is the side imported here; the scripts next to it run
in that environment. Shared by the agreement tests and the benchmarks' agent group."""
