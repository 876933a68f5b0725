"""Durable Python agents, the run actor's side: the program's socket server, its steps, its run.

* :mod:`~nodus_ray.runtime.program.server`: `ProgramServer`, each protocol request a journaled step;
* :mod:`~nodus_ray.runtime.program.waits`: timers, messages, children, sends and outputs;
* :mod:`~nodus_ray.runtime.program.model_calls`: the program's Messages API calls as model steps;
* :mod:`~nodus_ray.runtime.program.python_program`: `PythonProgram`, one actor's run of the program.
"""

__all__: list[str] = []
