"""Protocol adapters (docs/protocols.md): A2A, MCP and SLIM over encrypted channels, and the
bridge that translates between them. Each adapter reads only its own protocol's
envelopes from a channel and leaves the others for their readers.

- :mod:`~svc_sdk.adapters.a2a`: ``SvcA2AAdapter``, agent-card helpers (extra ``a2a``)
- :mod:`~svc_sdk.adapters.a2a_rpc`: a2a-sdk client transport and server (extra ``a2a``)
- :mod:`~svc_sdk.adapters.mcp`: ``SvcTransport``; ``SvcMCPTransport``/``serve_mcp``
  for the MCP SDK (extra ``mcp``)
- :mod:`~svc_sdk.adapters.slim`: ``SLIMAdapter``
- :mod:`~svc_sdk.adapters.bridge`: ``ProtocolBridge``
- :mod:`~svc_sdk.adapters.content`: the mapping between the protocols
"""
