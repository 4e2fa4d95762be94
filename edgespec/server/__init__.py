"""``edgespec serve``: the verification server (protocol v1) and OpenAI-compatible routes.

Needs the ``[server]`` extra (FastAPI, uvicorn); nothing outside this package imports them.
"""
