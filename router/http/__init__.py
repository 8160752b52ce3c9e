"""The HTTP frontend: REST and Server-Sent Events (see docs/http.md)."""
