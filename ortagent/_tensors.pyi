# ortagent._tensors has no Python API: its functions are cimported by the other modules.
