"""svc server side, installed as ``svc_server``: the account API and the relay."""
