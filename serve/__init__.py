"""spec-serve: an OpenAI-compatible HTTP server over one SpeculativeDecoder (Starlette + uvicorn:
`pip install 'specedge[serve]'`). create_app(decoder, ...) is the ASGI app; cli.main is spec-serve."""

__all__ = ["create_app"]


def __getattr__(name):       # starlette loads on use: spec-serve without it names the extra to install
    if name == "create_app":
        from .app import create_app
        return create_app
    raise AttributeError(name)
