"""svc integrations, installed as ``svc_integrations``: LangChain, MCP server, A2A cards."""
