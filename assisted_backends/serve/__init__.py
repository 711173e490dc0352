"""`assisted-serve`: an OpenAI-compatible HTTP server over the package's one decoding loop (docs/serve.md).

Modules: `cli` (flags, checks), `server` (loading, uvicorn), `app` (routes), `schemas` (request bodies),
`prompts` (chat template, tokens, context), `text` (detokenizing, stop strings), `engine` (the thread that
owns the models and runs the batch), `metrics` (Prometheus), `errors` (the OpenAI error shape). FastAPI,
uvicorn and prometheus-client are imported only when a server starts (`pip install -e ".[serve]"`).
"""


def main(argv: list[str] | None = None) -> int:
    from assisted_backends.serve.cli import main as run

    return run(argv)
