"""Bridges from agent frameworks to agentmux streams: each maps one framework's streaming events to typed
messages through a producer (``client.stream()``), so every client protocol agentmux serves shows that
framework's run live.

- :mod:`agentmux.bridges.openai_agents`: the OpenAI Agents SDK (``Runner.run_streamed``);
- :mod:`agentmux.bridges.langchain`: LangChain and LangGraph (a callback handler).

Each module imports its framework only when used, so ``import agentmux`` never needs one; the frameworks are
in the package's ``dev`` extra, not its dependencies.
"""
