# ortagent._agent_run has no Python API: the agent engine cimports its functions.
