"""Generated from proto/relay.proto; do not edit."""
